//! Handlers in DAGs: a lambda's tarball identified by its SHA-256, unpacked once per digest on
//! the host that runs it, and the Python runner that calls `f(event)` under Sonic's file ABI.
//!
//! The registry keeps each installed lambda's `.tar.gz` (`packages/<name>.tar.gz`); the control
//! plane puts it in the object store under its digest, the run request names the digest, and
//! the agent fetches it, checks the digest and unpacks it here ([`unpack_verified`]) before it
//! runs `python3 sonic_dag_runner.py <lambda-dir>` ([`RUNNER_PY`], with the `sonic` module,
//! [`SONIC_PY`], on `PYTHONPATH`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest;

/// The runner of a handler stage: builds `event` from the file ABI, calls `f(event)` once and
/// writes what it returned as the run's output files.
pub const RUNNER_PY: &str = include_str!("../python/sonic_dag_runner.py");
/// The `sonic` module a handler imports to read its input files and write output files.
pub const SONIC_PY: &str = include_str!("../python/sonic.py");
/// The runner's file name in the runtime folder ([`install_runtime`]).
pub const RUNNER_FILE: &str = "sonic_dag_runner.py";

/// The most bytes an unpacked lambda may take on an agent.
pub const MAX_UNPACKED: u64 = 1 << 30;

/// A registered lambda's code as a DAG stage gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// The SHA-256 of its `.tar.gz`, 64 lowercase hex digits.
    pub sha256: String,
    /// The `.tar.gz` the registry keeps.
    pub path: PathBuf,
}

/// Why a package could not be made ready to run.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// The bytes do not have the digest the run asked for.
    #[error("the lambda's tarball has digest {got}, not the {want} the run names")]
    Digest {
        /// The digest asked for.
        want: String,
        /// The digest of the bytes fetched.
        got: String,
    },
    /// The tarball could not be unpacked safely.
    #[error("the lambda's tarball: {0}")]
    Tar(#[from] crate::tarball::TarError),
    /// It has no `f.py` at its top.
    #[error("the lambda's tarball has no f.py at its top")]
    NoHandler,
    /// Disk.
    #[error("cannot unpack the lambda: {0}")]
    Io(#[from] std::io::Error),
}

/// The SHA-256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

static STAGING: AtomicU64 = AtomicU64::new(0);

/// Makes the lambda of digest `sha256` ready under `cache/<sha256>/` and returns that folder:
/// already there, or `tarball` (checked against the digest first) unpacked beside and renamed in
/// place, so that a folder under its digest is always complete. Blocking; call it off the async
/// runtime.
pub fn unpack_verified(
    cache: &Path,
    sha256: &str,
    tarball: &[u8],
) -> Result<PathBuf, PackageError> {
    let dest = cache.join(sha256);
    if dest.join("f.py").is_file() {
        return Ok(dest);
    }
    let got = sha256_hex(tarball);
    if got != sha256 {
        return Err(PackageError::Digest {
            want: sha256.to_owned(),
            got,
        });
    }
    std::fs::create_dir_all(cache)?;
    let n = STAGING.fetch_add(1, Ordering::Relaxed);
    let staging = cache.join(format!(".new-{sha256}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging)?;
    let unpacked = crate::tarball::unpack(tarball, &staging, MAX_UNPACKED)
        .map_err(PackageError::from)
        .and_then(|()| {
            if staging.join("f.py").is_file() {
                Ok(())
            } else {
                Err(PackageError::NoHandler)
            }
        });
    if let Err(e) = unpacked {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    match std::fs::rename(&staging, &dest) {
        Ok(()) => Ok(dest),
        // Another run unpacked the same digest first: same bytes, keep theirs.
        Err(_) if dest.join("f.py").is_file() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(dest)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e.into())
        }
    }
}

/// Writes the runner and the `sonic` module into `dir` (created if needed) and returns the
/// runner's path; `dir` is then what `PYTHONPATH` names.
pub fn install_runtime(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in [(RUNNER_FILE, RUNNER_PY), ("sonic.py", SONIC_PY)] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &path)?;
        }
    }
    Ok(dir.join(RUNNER_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tarball() -> Vec<u8> {
        // One file, f.py, in a ustar archive, gzipped.
        let body = b"def f(event):\n    return event\n";
        let mut header = [0u8; 512];
        header[..4].copy_from_slice(b"f.py");
        header[100..107].copy_from_slice(b"0000644");
        let size = format!("{:011o}", body.len());
        header[124..135].copy_from_slice(size.as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..262].copy_from_slice(b"ustar");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        let mut tar = header.to_vec();
        tar.extend_from_slice(body);
        tar.resize(512 * 2, 0);
        tar.resize(512 * 4, 0);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).expect("gzip");
        gz.finish().expect("gzip")
    }

    #[test]
    fn unpacks_once_per_digest_and_refuses_other_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tgz = tarball();
        let sha = sha256_hex(&tgz);
        let wrong = sha256_hex(b"other");
        let err = unpack_verified(dir.path(), &wrong, &tgz).expect_err("digest");
        assert!(err.to_string().contains("digest"), "{err}");
        assert!(!dir.path().join(&wrong).exists());
        let at = unpack_verified(dir.path(), &sha, &tgz).expect("unpack");
        assert!(at.join("f.py").is_file());
        // Cached: the bytes are not looked at again.
        assert_eq!(unpack_verified(dir.path(), &sha, b"").expect("cached"), at);
        let runner = install_runtime(&dir.path().join("rt")).expect("runtime");
        assert!(runner.is_file() && dir.path().join("rt/sonic.py").is_file());
    }
}
