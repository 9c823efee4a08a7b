//! OpenLambda's registry folder: where lambdas are kept as `<name>.tar.gz`, `<name>.py` or a
//! folder `<name>/` (looked for in that order, as OpenLambda's code puller does), read when a
//! call needs the lambda and again once the cache interval has passed.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A lambda's code as the registry folder holds it.
#[derive(Debug)]
pub enum Source {
    /// A `.tar.gz` of its folder (an upload, or `<name>.tar.gz`).
    Tarball(bytes::Bytes),
    /// A lone handler (`<name>.py`), installed as its `f.py`.
    Script(Vec<u8>),
    /// A folder's files (`<name>/`): relative paths and contents, sorted by path.
    Files(Vec<(PathBuf, Vec<u8>)>),
}

impl Source {
    /// What identifies the content: a new version of the lambda has another digest.
    pub fn digest(&self) -> String {
        match self {
            Source::Tarball(b) => crate::package::sha256_hex(b),
            Source::Script(b) => format!("py:{}", crate::package::sha256_hex(b)),
            Source::Files(files) => {
                let mut h = Sha256::new();
                for (path, data) in files {
                    let p = path.to_string_lossy();
                    h.update((p.len() as u64).to_le_bytes());
                    h.update(p.as_bytes());
                    h.update((data.len() as u64).to_le_bytes());
                    h.update(data);
                }
                format!("dir:{}", hex::encode(h.finalize()))
            }
        }
    }

    /// Writes the lambda's files into `dest` (an empty folder), refusing what could reach
    /// outside it or exceed `max_bytes`.
    pub fn unpack(&self, dest: &Path, max_bytes: u64) -> Result<(), String> {
        match self {
            Source::Tarball(b) => {
                crate::tarball::unpack(b, dest, max_bytes).map_err(|e| e.to_string())
            }
            Source::Script(b) => {
                std::fs::write(dest.join("f.py"), b).map_err(|e| format!("cannot write f.py: {e}"))
            }
            Source::Files(files) => {
                for (rel, data) in files {
                    let to = dest.join(rel);
                    if let Some(parent) = to.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| format!("cannot copy {}: {e}", rel.display()))?;
                    }
                    std::fs::write(&to, data)
                        .map_err(|e| format!("cannot copy {}: {e}", rel.display()))?;
                }
                Ok(())
            }
        }
    }
}

/// Looks lambda `name` up in `folder`: `Ok(None)` when the folder has none of its forms.
pub fn find(folder: &Path, name: &str, max_bytes: u64) -> Result<Option<Source>, String> {
    let tarball = folder.join(format!("{name}.tar.gz"));
    if let Some(b) = read_if_file(&tarball, max_bytes)? {
        return Ok(Some(Source::Tarball(b.into())));
    }
    let script = folder.join(format!("{name}.py"));
    if let Some(b) = read_if_file(&script, max_bytes)? {
        return Ok(Some(Source::Script(b)));
    }
    let dir = folder.join(name);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {
            let mut files = Vec::new();
            let mut total = 0;
            read_tree(&dir, Path::new(""), &mut files, &mut total, max_bytes)?;
            files.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(Some(Source::Files(files)))
        }
        Ok(_) => Err(format!(
            "{} is not a folder, a .tar.gz or a .py file",
            dir.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", dir.display())),
    }
}

/// The names of the lambdas `folder` holds, in any of their forms.
pub fn names(folder: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            if file.starts_with('.') {
                return None;
            }
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                return Some(file);
            }
            file.strip_suffix(".tar.gz")
                .or_else(|| file.strip_suffix(".py"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Keeps an uploaded tarball as `<folder>/<name>.tar.gz`, written beside and renamed, so that a
/// reader never sees half of it.
pub fn keep(folder: &Path, name: &str, tarball: &[u8], n: u64) -> std::io::Result<()> {
    let tmp = folder.join(format!(".{name}.tar.gz.new-{n}"));
    let written = std::fs::write(&tmp, tarball)
        .and_then(|()| std::fs::rename(&tmp, folder.join(format!("{name}.tar.gz"))));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Removes every form of lambda `name` from `folder`; whether there was one.
pub fn remove(folder: &Path, name: &str) -> std::io::Result<bool> {
    let mut found = false;
    for file in [format!("{name}.tar.gz"), format!("{name}.py")] {
        match std::fs::remove_file(folder.join(file)) {
            Ok(()) => found = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match std::fs::remove_dir_all(folder.join(name)) {
        Ok(()) => found = true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(found)
}

fn read_if_file(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            if m.len() > max_bytes {
                return Err(format!(
                    "{} is larger than {max_bytes} bytes",
                    path.display()
                ));
            }
            std::fs::read(path)
                .map(Some)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
        }
        Ok(_) => Err(format!("{} is not a file", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Reads a lambda folder's regular files; symlinks and special files are refused (a copy
/// must not reach outside the folder), and so is more than `max_bytes` in all.
fn read_tree(
    root: &Path,
    rel: &Path,
    files: &mut Vec<(PathBuf, Vec<u8>)>,
    total: &mut u64,
    max_bytes: u64,
) -> Result<(), String> {
    let dir = root.join(rel);
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = rel.join(e.file_name());
        let kind = e
            .file_type()
            .map_err(|err| format!("cannot read {}: {err}", e.path().display()))?;
        if kind.is_dir() {
            read_tree(root, &path, files, total, max_bytes)?;
        } else if kind.is_file() {
            let data = std::fs::read(e.path())
                .map_err(|err| format!("cannot read {}: {err}", e.path().display()))?;
            *total += data.len() as u64;
            if *total > max_bytes {
                return Err(format!(
                    "the lambda folder {} holds more than {max_bytes} bytes",
                    root.display()
                ));
            }
            files.push((path, data));
        } else {
            return Err(format!(
                "{}: only regular files and folders are copied from a registry folder (not symlinks or devices)",
                e.path().display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lambda_is_found_as_tarball_script_or_folder_in_that_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert!(find(d, "a", 1 << 20).expect("reads").is_none());
        std::fs::create_dir_all(d.join("a/sub")).expect("mkdir");
        std::fs::write(d.join("a/f.py"), "def f(e): return 1\n").expect("write");
        std::fs::write(d.join("a/sub/x.txt"), "x").expect("write");
        let Some(Source::Files(files)) = find(d, "a", 1 << 20).expect("reads") else {
            panic!("a folder");
        };
        let paths: Vec<_> = files.iter().map(|(p, _)| p.display().to_string()).collect();
        assert_eq!(paths, ["f.py", "sub/x.txt"]);
        let folder_digest = find(d, "a", 1 << 20)
            .expect("reads")
            .expect("found")
            .digest();
        std::fs::write(d.join("a/sub/x.txt"), "y").expect("write");
        let changed = find(d, "a", 1 << 20)
            .expect("reads")
            .expect("found")
            .digest();
        assert_ne!(folder_digest, changed, "a changed file is a new version");
        std::fs::write(d.join("a.py"), "def f(e): return 2\n").expect("write");
        assert!(matches!(find(d, "a", 1 << 20), Ok(Some(Source::Script(_)))));
        std::fs::write(d.join("a.tar.gz"), b"\x1f\x8b").expect("write");
        assert!(matches!(
            find(d, "a", 1 << 20),
            Ok(Some(Source::Tarball(_)))
        ));
        assert_eq!(names(d), ["a"]);
        // Too large, and a symlink in a folder, are refused.
        assert!(find(d, "a", 1).is_err());
        std::fs::create_dir(d.join("b")).expect("mkdir");
        std::os::unix::fs::symlink("/etc/passwd", d.join("b/f.py")).expect("symlink");
        let err = find(d, "b", 1 << 20).expect_err("refused");
        assert!(err.contains("only regular files"), "{err}");
        assert!(remove(d, "a").expect("removes"));
        assert!(!remove(d, "a").expect("nothing left"));
        assert_eq!(names(d), ["b"]);
    }

    #[test]
    fn a_kept_tarball_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        keep(dir.path(), "v", b"one", 1).expect("kept");
        keep(dir.path(), "v", b"two", 2).expect("kept");
        assert_eq!(
            std::fs::read(dir.path().join("v.tar.gz")).expect("read"),
            b"two"
        );
        assert_eq!(names(dir.path()), ["v"], "no temporary file is left");
    }
}
