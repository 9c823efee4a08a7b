//! File moves of the sandboxes: inputs in by hard link, outputs out by rename (copies only across
//! filesystems), and the bounded tail of an instance's log.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How many files a tree operation linked or renamed, and how many it had to copy.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TreeStats {
    pub linked: u64,
    pub copied: u64,
}

fn cross_device(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EXDEV)
}

/// Recreates the tree `src` at `dst` with hard links to the same files (never copies, unless `dst`
/// is on another filesystem). Symbolic links are followed: a link may point outside of what the
/// lambda can see.
pub(crate) fn link_tree(src: &Path, dst: &Path) -> io::Result<TreeStats> {
    let mut stats = TreeStats::default();
    fs::create_dir_all(dst)?;
    let entries = match fs::read_dir(src) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(stats),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let mut file_type = entry.file_type()?;
        let mut target = from.clone();
        if file_type.is_symlink() {
            target = fs::canonicalize(&from)?;
            file_type = fs::metadata(&target)?.file_type();
        }
        if file_type.is_dir() {
            let sub = link_tree(&target, &to)?;
            stats.linked += sub.linked;
            stats.copied += sub.copied;
        } else {
            match fs::hard_link(&target, &to) {
                Ok(()) => stats.linked += 1,
                Err(e) if cross_device(&e) => {
                    fs::copy(&target, &to)?;
                    stats.copied += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(stats)
}

/// Moves every entry of `src` into `dst` by rename, merging folders that exist in both, replacing
/// files that exist in both; copies then removes across filesystems. `src` is left empty.
pub(crate) fn move_tree(src: &Path, dst: &Path) -> io::Result<TreeStats> {
    let mut stats = TreeStats::default();
    fs::create_dir_all(dst)?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let is_dir = entry.file_type()?.is_dir();
        let to_is_dir = fs::symlink_metadata(&to).map(|m| m.is_dir()).ok();
        if is_dir && to_is_dir == Some(true) {
            let sub = move_tree(&from, &to)?;
            stats.linked += sub.linked;
            stats.copied += sub.copied;
            fs::remove_dir(&from)?;
            continue;
        }
        match fs::rename(&from, &to) {
            Ok(()) => stats.linked += 1,
            Err(e) if cross_device(&e) => {
                stats.copied += copy_tree(&from, &to)?;
                if is_dir {
                    fs::remove_dir_all(&from)?;
                } else {
                    fs::remove_file(&from)?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(stats)
}

/// Copies a tree; a symbolic link is copied as a link, never followed (a lambda's link may point
/// at any host file; the agent refuses links among outputs).
fn copy_tree(src: &Path, dst: &Path) -> io::Result<u64> {
    let meta = fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)?;
        return Ok(1);
    }
    if !meta.is_dir() {
        fs::copy(src, dst)?;
        return Ok(1);
    }
    fs::create_dir_all(dst)?;
    let mut n = 0;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        n += copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
    }
    Ok(n)
}

/// Bytes held by the trees at `roots`: per entry the larger of its length and its allocated blocks
/// (a sparse file counts at its length), symbolic links not followed, missing roots as 0. Stops
/// counting once past `stop_after` (the caller only needs to know it is over).
pub(crate) fn tree_bytes(roots: &[PathBuf], stop_after: u64) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, total: &mut u64, stop_after: u64) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if *total > stop_after {
                return;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            *total = total.saturating_add(meta.len().max(meta.blocks().saturating_mul(512)));
            if meta.is_dir() {
                walk(&entry.path(), total, stop_after);
            }
        }
    }
    let mut total = 0u64;
    for root in roots {
        walk(root, &mut total, stop_after);
    }
    total
}

/// Resolves once the trees at `roots` hold more than `quota` bytes, checking every `every`; never
/// when `quota` is `u64::MAX`.
pub(crate) async fn quota_exceeded(roots: Vec<PathBuf>, quota: u64, every: std::time::Duration) {
    if quota == u64::MAX {
        return std::future::pending().await;
    }
    let roots = std::sync::Arc::new(roots);
    loop {
        tokio::time::sleep(every).await;
        let r = roots.clone();
        match tokio::task::spawn_blocking(move || tree_bytes(&r, quota)).await {
            Ok(used) if used > quota => return,
            _ => {}
        }
    }
}

/// Removes a tree if it exists.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The last `max` bytes of a file as text (invalid UTF-8 replaced); empty when it is missing.
pub(crate) fn tail_file(path: &Path, max: usize) -> io::Result<String> {
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max as u64);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.take(max as u64).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `max` bytes written to it.
#[derive(Debug)]
pub(crate) struct Tail {
    buf: VecDeque<u8>,
    max: usize,
}

impl Tail {
    pub fn new(max: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            max,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(self.max)..];
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(self.max);
        self.buf.drain(..overflow.min(self.buf.len()));
        self.buf.extend(bytes);
    }

    pub fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(p: &Path, s: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, s).unwrap();
    }

    #[test]
    fn link_tree_shares_inodes() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        write(&src.join("input/a"), "a");
        write(&src.join("map/0/part-1"), "p");
        std::os::unix::fs::symlink(src.join("input/a"), src.join("link")).unwrap();
        let dst = d.path().join("dst");
        let stats = link_tree(&src, &dst).unwrap();
        assert_eq!(
            stats,
            TreeStats {
                linked: 3,
                copied: 0
            }
        );
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&dst.join("input/a")), ino(&src.join("input/a")));
        assert_eq!(ino(&dst.join("link")), ino(&src.join("input/a")));
        assert_eq!(fs::read_to_string(dst.join("map/0/part-1")).unwrap(), "p");
        // A missing source is an empty input.
        assert_eq!(
            link_tree(&d.path().join("none"), &d.path().join("e"))
                .unwrap()
                .linked,
            0
        );
        assert!(d.path().join("e").is_dir());
    }

    #[test]
    fn move_tree_merges_and_empties_the_source() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        let dst = d.path().join("dst");
        write(&src.join("result/x"), "new-x");
        write(&src.join("result/y"), "y");
        write(&src.join("train/part-0"), "t");
        write(&dst.join("result/x"), "old-x");
        write(&dst.join("result/z"), "z");
        let ino = fs::metadata(src.join("train/part-0")).unwrap().ino();
        move_tree(&src, &dst).unwrap();
        assert_eq!(fs::read_dir(&src).unwrap().count(), 0);
        assert_eq!(fs::read_to_string(dst.join("result/x")).unwrap(), "new-x");
        assert_eq!(fs::read_to_string(dst.join("result/y")).unwrap(), "y");
        assert_eq!(fs::read_to_string(dst.join("result/z")).unwrap(), "z");
        assert_eq!(fs::metadata(dst.join("train/part-0")).unwrap().ino(), ino);
    }

    #[test]
    fn copies_keep_links_as_links() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        write(&src.join("result/real"), "r");
        std::os::unix::fs::symlink("/etc/passwd", src.join("result/passwd")).unwrap();
        let n = copy_tree(&src, &d.path().join("dst")).unwrap();
        assert_eq!(n, 2);
        let link = d.path().join("dst/result/passwd");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/etc/passwd"));
    }

    #[test]
    fn tree_bytes_counts_lengths_and_sparse_files() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("a/x"), &"x".repeat(5000));
        let sparse = fs::File::create(d.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("a/usr")).unwrap();
        let roots = [d.path().to_path_buf(), d.path().join("missing")];
        let total = tree_bytes(&roots, u64::MAX);
        assert!(total >= (1 << 30) + 5000, "{total}");
        assert!(
            total < (1 << 30) + 64 * 1024,
            "a link is not followed: {total}"
        );
        assert!(tree_bytes(&roots, 10) > 10);
    }

    #[test]
    fn tails() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        fs::write(&p, "0123456789").unwrap();
        assert_eq!(tail_file(&p, 4).unwrap(), "6789");
        assert_eq!(tail_file(&p, 100).unwrap(), "0123456789");
        assert_eq!(tail_file(&d.path().join("none"), 4).unwrap(), "");

        let mut t = Tail::new(5);
        t.push(b"abc");
        t.push(b"def");
        assert_eq!(t.text(), "bcdef");
        t.push(b"0123456789");
        assert_eq!(t.text(), "56789");
        t.push(b"");
        assert_eq!(t.text(), "56789");
    }
}
