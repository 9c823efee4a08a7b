//! Unpacking a lambda's `.tar.gz` safely: regular files and folders below the target only.
//!
//! A minimal reader of the ustar, GNU long-name and pax formats (what `tar -czf` and Python's
//! `tarfile` write). Anything that could reach outside the lambda's folder is refused: absolute
//! paths, `..`, hard links, device files, and symlinks that are absolute or contain `..`
//! (a symlink that only goes down cannot lead out, whatever other symlinks exist).

use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a tarball was refused. Each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// The body does not start with gzip's magic bytes.
    #[error("the body is not a gzip file (expected a .tar.gz of the lambda's folder)")]
    NotGzip,
    /// The gzip or tar stream is broken.
    #[error("the tarball is corrupt: {0}")]
    Corrupt(String),
    /// An entry's path is absolute or contains `..`.
    #[error("entry `{0}`: paths must be relative and stay inside the lambda's folder")]
    UnsafePath(String),
    /// A symlink points outside the folder (absolute, or with `..`).
    #[error("symlink `{0}` -> `{1}`: symlinks must be relative and must not contain `..`")]
    UnsafeSymlink(String, String),
    /// An entry of a kind a lambda has no use for.
    #[error("entry `{0}`: {1} are not supported")]
    Unsupported(String, &'static str),
    /// Unpacked, it would take more than the limit.
    #[error("the unpacked lambda exceeds {0} bytes")]
    TooLarge(u64),
    /// Writing to disk failed.
    #[error("cannot unpack: {0}")]
    Io(#[from] std::io::Error),
}

const BLOCK: usize = 512;
const MAX_ENTRIES: usize = 100_000;
const MAX_HEADER_DATA: u64 = 1 << 20;

/// Unpacks `gz` into `dest` (which must exist and be empty). At most `max_bytes` of file data.
/// On an error, `dest` may hold part of the tarball: the caller removes it.
pub fn unpack(gz: &[u8], dest: &Path, max_bytes: u64) -> Result<(), TarError> {
    if gz.len() < 2 || gz[0] != 0x1f || gz[1] != 0x8b {
        return Err(TarError::NotGzip);
    }
    let mut r = flate2::read::GzDecoder::new(gz);
    let mut total: u64 = 0;
    let mut long_name: Option<String> = None;
    let mut long_link: Option<String> = None;
    let mut entries = 0usize;
    loop {
        let mut header = [0u8; BLOCK];
        if !read_block(&mut r, &mut header)? || header.iter().all(|&b| b == 0) {
            return Ok(());
        }
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(TarError::Corrupt(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        check_sum(&header)?;
        let size = parse_size(&header[124..136])?;
        let kind = header[156];
        let name = long_name.take().unwrap_or_else(|| ustar_name(&header));
        let link = long_link.take().unwrap_or_else(|| cstr(&header[157..257]));
        match kind {
            b'L' | b'K' | b'x' | b'g' => {
                if size > MAX_HEADER_DATA {
                    return Err(TarError::Corrupt("an extended header is too large".into()));
                }
                let data = read_data(&mut r, size)?;
                match kind {
                    b'L' => long_name = Some(cstr(&data)),
                    b'K' => long_link = Some(cstr(&data)),
                    b'x' => {
                        let (path, linkpath) = pax(&data)?;
                        long_name = path;
                        long_link = linkpath;
                    }
                    _ => {}
                }
                continue;
            }
            _ => {}
        }
        let Some(rel) = safe_path(&name)? else {
            skip(&mut r, size)?;
            continue;
        };
        let target = dest.join(&rel);
        match kind {
            b'0' | 0 | b'7' => {
                total = total.saturating_add(size);
                if total > max_bytes {
                    return Err(TarError::TooLarge(max_bytes));
                }
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                remove_existing(&target)?;
                let mut file = std::fs::File::create(&target)?;
                let copied = std::io::copy(&mut (&mut r).take(size), &mut file)?;
                if copied != size {
                    return Err(TarError::Corrupt("truncated file data".into()));
                }
                skip_padding(&mut r, size)?;
            }
            b'5' => {
                std::fs::create_dir_all(&target)?;
                skip(&mut r, size)?;
            }
            b'2' => {
                if link.starts_with('/') || link.split('/').any(|c| c == "..") || link.is_empty() {
                    return Err(TarError::UnsafeSymlink(name, link));
                }
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                remove_existing(&target)?;
                std::os::unix::fs::symlink(&link, &target)?;
                skip(&mut r, size)?;
            }
            b'1' => return Err(TarError::Unsupported(name, "hard links")),
            _ => {
                return Err(TarError::Unsupported(
                    name,
                    "device files, fifos and other special entries",
                ));
            }
        }
    }
}

fn remove_existing(target: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(target),
        Ok(_) => std::fs::remove_file(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The entry's path below the folder; `None` for the folder itself (`./`).
fn safe_path(name: &str) -> Result<Option<PathBuf>, TarError> {
    if name.starts_with('/') {
        return Err(TarError::UnsafePath(name.to_string()));
    }
    let mut out = PathBuf::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(TarError::UnsafePath(name.to_string())),
            c => out.push(c),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn read_block(r: &mut impl Read, buf: &mut [u8; BLOCK]) -> Result<bool, TarError> {
    let mut filled = 0;
    while filled < BLOCK {
        match r.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(TarError::Corrupt("truncated header".into())),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TarError::Corrupt(e.to_string())),
        }
    }
    Ok(true)
}

fn read_data(r: &mut impl Read, size: u64) -> Result<Vec<u8>, TarError> {
    let mut data = Vec::new();
    r.take(size)
        .read_to_end(&mut data)
        .map_err(|e| TarError::Corrupt(e.to_string()))?;
    if data.len() as u64 != size {
        return Err(TarError::Corrupt("truncated entry".into()));
    }
    skip_padding(r, size)?;
    Ok(data)
}

fn skip(r: &mut impl Read, size: u64) -> Result<(), TarError> {
    let n = std::io::copy(&mut r.take(size), &mut std::io::sink())
        .map_err(|e| TarError::Corrupt(e.to_string()))?;
    if n != size {
        return Err(TarError::Corrupt("truncated entry".into()));
    }
    skip_padding(r, size)
}

fn skip_padding(r: &mut impl Read, size: u64) -> Result<(), TarError> {
    let pad = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
    std::io::copy(&mut r.take(pad), &mut std::io::sink())
        .map_err(|e| TarError::Corrupt(e.to_string()))?;
    Ok(())
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn ustar_name(h: &[u8; BLOCK]) -> String {
    let name = cstr(&h[0..100]);
    if &h[257..262] == b"ustar" {
        let prefix = cstr(&h[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

fn parse_size(field: &[u8]) -> Result<u64, TarError> {
    if field[0] & 0x80 != 0 {
        // GNU base-256: far larger than any lambda.
        return Err(TarError::Corrupt("an entry is too large".into()));
    }
    let s = cstr(field);
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).map_err(|_| TarError::Corrupt(format!("bad size field `{s}`")))
}

fn check_sum(h: &[u8; BLOCK]) -> Result<(), TarError> {
    let stored = cstr(&h[148..156]);
    let stored = stored.trim_matches(|c: char| c == ' ' || c == '\0');
    let stored = u32::from_str_radix(stored, 8)
        .map_err(|_| TarError::Corrupt("not a tar archive (bad header checksum)".into()))?;
    let sum: u32 = h
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    if sum != stored {
        return Err(TarError::Corrupt(
            "not a tar archive (bad header checksum)".into(),
        ));
    }
    Ok(())
}

type PaxPaths = (Option<String>, Option<String>);

fn pax(data: &[u8]) -> Result<PaxPaths, TarError> {
    let (mut path, mut link) = (None, None);
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| TarError::Corrupt("bad pax header".into()))?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l > space && l <= rest.len())
            .ok_or_else(|| TarError::Corrupt("bad pax header".into()))?;
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            let value = String::from_utf8_lossy(&record[eq + 1..]).into_owned();
            match &record[..eq] {
                b"path" => path = Some(value),
                b"linkpath" => link = Some(value),
                _ => {}
            }
        }
        rest = &rest[len..];
    }
    Ok((path, link))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_only() {
        assert_eq!(
            safe_path("./f.py").ok().flatten(),
            Some(PathBuf::from("f.py"))
        );
        assert_eq!(safe_path("./").ok().flatten(), None);
        assert!(safe_path("/etc/passwd").is_err());
        assert!(safe_path("a/../../x").is_err());
    }

    #[test]
    fn not_gzip_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            unpack(b"hello", dir.path(), 1 << 20),
            Err(TarError::NotGzip)
        ));
    }
}
