//! Secrets: generated from the kernel's generator, read from files, kept in a data folder.

use std::io::{Read, Write};
use std::path::Path;

use crate::config::ConfigError;

/// The shortest secret accepted: a guessable secret protects nothing.
pub const MIN_SECRET_LEN: usize = 16;

/// Whether `presented` is the secret `expected`, in time that depends on neither's content, on
/// where they differ, nor on `expected`'s length: both are hashed (SHA-256) and the digests
/// compared in constant time (`subtle`). An empty `expected` matches nothing (not even an empty
/// `presented`).
pub fn matches(presented: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let same: bool = Sha256::digest(presented)
        .ct_eq(&Sha256::digest(expected))
        .into();
    same && !expected.is_empty()
}

/// A secret of `2 * bytes` hex digits from `/dev/urandom`.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut b = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Checks a configured secret: at least [`MIN_SECRET_LEN`] characters. `what` names the setting.
pub fn check(what: &str, secret: &str) -> Result<(), ConfigError> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(ConfigError::Invalid(format!(
            "{what}: set a secret of at least {MIN_SECRET_LEN} characters"
        )));
    }
    Ok(())
}

/// Reads a secret from a file (surrounding whitespace, such as a final newline, is not part of it).
pub fn read_file(what: &str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let secret = text.trim().to_owned();
    check(&format!("{what} ({})", path.display()), &secret)?;
    Ok(secret)
}

/// The secret kept in `path`, made (32 hex digits, mode 0600) when there is none yet; `true` when
/// it was made now. Two processes racing to make it agree on the one that was written first.
pub fn load_or_create(what: &str, path: &Path) -> Result<(String, bool), ConfigError> {
    use std::os::unix::fs::OpenOptionsExt;
    if path.exists() {
        return Ok((read_file(what, path)?, false));
    }
    let io = |source: std::io::Error| ConfigError::Read {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let secret = random_hex(16).map_err(io)?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(secret.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        // A hard link fails when another process made the file first: then its secret wins.
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok((secret, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok((read_file(what, path)?, false))
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_only_the_same_nonempty_secret() {
        assert!(super::matches(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!super::matches(b"0123456789abcdeF", b"0123456789abcdef"));
        assert!(
            !super::matches(b"0123456789abcde", b"0123456789abcdef"),
            "a prefix"
        );
        assert!(
            !super::matches(b"0123456789abcdef0", b"0123456789abcdef"),
            "longer"
        );
        assert!(!super::matches(b"", b""), "an empty secret matches nothing");
    }

    use super::*;

    #[test]
    fn made_once_then_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys").join("file-key");
        let (a, made) = load_or_create("file key", &path).expect("make");
        assert!(made);
        assert_eq!(a.len(), 32);
        let (b, made) = load_or_create("file key", &path).expect("load");
        assert!(!made);
        assert_eq!(a, b, "the same secret after a restart");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn short_or_missing_secrets_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").expect("write");
        assert!(
            matches!(read_file("join token", &short), Err(ConfigError::Invalid(m)) if m.contains("join token"))
        );
        assert!(matches!(
            read_file("join token", &dir.path().join("none")),
            Err(ConfigError::Read { .. })
        ));
        assert!(check("token", "0123456789abcdef").is_ok());
    }
}
