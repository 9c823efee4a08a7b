//! File-access tokens: an HMAC-SHA256 capability that lets one agent read one file (or one folder) of
//! one job from another agent's file server, until an expiry time.
//!
//! The control plane holds the key shared with its agents, issues a token per edge it plans as
//! `direct`, and hands it to the receiving agent; the sending agent's file server verifies it. Tokens
//! are opaque ASCII strings safe in an HTTP header or a query parameter.
//!
//! Two forms:
//! - **exact** ([`issue`]): `v1.<expiry>.<mac>`, opens exactly one `(job, path)`;
//! - **prefix** ([`issue_prefix`]): `v1p.<expiry>.<hex(prefix)>.<mac>`, opens every path of the job
//!   that starts with `prefix`, where `prefix` is empty (the whole job) or ends with `/` (so a token
//!   for `train/0/` opens `train/0/x` but neither `train/01/x` nor `train/0`).
//!
//! `<expiry>` is in Unix seconds; the token is valid while `now < expiry`. `<mac>` is lowercase hex of
//! HMAC-SHA256 over a domain-separated, length-prefixed encoding of (form, job, path or prefix,
//! expiry), so no two different inputs share a message. Comparison is constant-time.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const EXACT_TAG: &str = "v1";
const PREFIX_TAG: &str = "v1p";
const DOMAIN: &[u8] = b"sonic-file-token/v1";
/// Bounds the work done on untrusted input before any MAC is computed.
const MAX_TOKEN_LEN: usize = 4096;

/// Why a token was refused. Clients should not be told more than "forbidden": the variants are for
/// logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token of a known form.
    Malformed,
    /// The MAC does not match: forged, another key, or issued for another job or path.
    BadSignature,
    /// Genuine but past its expiry.
    Expired,
    /// A genuine prefix token, for a prefix that does not contain the requested path.
    OutOfScope,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenError::Malformed => "malformed token",
            TokenError::BadSignature => "token signature does not match",
            TokenError::Expired => "token expired",
            TokenError::OutOfScope => "token does not cover this path",
        })
    }
}

impl std::error::Error for TokenError {}

/// Issues a token that opens exactly `(job, path)` until `expiry` (Unix seconds, exclusive).
pub fn issue(key: &[u8], job: &str, path: &str, expiry: u64) -> String {
    let mac = mac_hex(key, b'f', job, path, expiry);
    format!("{EXACT_TAG}.{expiry}.{mac}")
}

/// Issues a token that opens every path of `job` under `prefix` until `expiry` (Unix seconds,
/// exclusive). An empty prefix opens the whole job; a non-empty prefix not ending in `/` gets one
/// appended, so a prefix always names a folder, never a partial file name.
pub fn issue_prefix(key: &[u8], job: &str, prefix: &str, expiry: u64) -> String {
    let prefix = normalize_prefix(prefix);
    let mac = mac_hex(key, b'p', job, &prefix, expiry);
    format!(
        "{PREFIX_TAG}.{expiry}.{}.{mac}",
        hex::encode(prefix.as_bytes())
    )
}

/// Checks that `token` opens `(job, path)` at time `now` (Unix seconds).
///
/// The MAC is checked before the expiry, so a forged token is always `BadSignature`.
pub fn verify(key: &[u8], token: &str, job: &str, path: &str, now: u64) -> Result<(), TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let tag = parts.next().ok_or(TokenError::Malformed)?;
    let expiry: u64 = parts
        .next()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or(TokenError::Malformed)?;
    let (kind, scope) = match tag {
        EXACT_TAG => (b'f', path.to_owned()),
        PREFIX_TAG => {
            let raw = parts.next().ok_or(TokenError::Malformed)?;
            let bytes = hex::decode(raw).map_err(|_| TokenError::Malformed)?;
            let prefix = String::from_utf8(bytes).map_err(|_| TokenError::Malformed)?;
            (b'p', prefix)
        }
        _ => return Err(TokenError::Malformed),
    };
    let mac_raw = parts.next().ok_or(TokenError::Malformed)?;
    if parts.next().is_some() {
        return Err(TokenError::Malformed);
    }
    let given = hex::decode(mac_raw).map_err(|_| TokenError::Malformed)?;
    let mut mac = keyed(key);
    feed(&mut mac, kind, job, &scope, expiry);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&given)
        .map_err(|_| TokenError::BadSignature)?;
    if kind == b'p' && (normalize_prefix(&scope) != scope || !path.starts_with(&scope)) {
        return Err(TokenError::OutOfScope);
    }
    if now >= expiry {
        return Err(TokenError::Expired);
    }
    Ok(())
}

fn normalize_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length (long ones are hashed), so this never fails.
    HmacSha256::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("hmac accepts keys of any length"))
}

fn feed(mac: &mut HmacSha256, kind: u8, job: &str, scope: &str, expiry: u64) {
    mac.update(DOMAIN);
    mac.update(&[kind]);
    for field in [job.as_bytes(), scope.as_bytes()] {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field);
    }
    mac.update(&expiry.to_be_bytes());
}

fn mac_hex(key: &[u8], kind: u8, job: &str, scope: &str, expiry: u64) -> String {
    let mut mac = keyed(key);
    feed(&mut mac, kind, job, scope, expiry);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn exact_token_opens_its_path_until_expiry() {
        let t = issue(KEY, "j-1", "pca/0/train/data.bin", 1_000);
        assert_eq!(verify(KEY, &t, "j-1", "pca/0/train/data.bin", 999), Ok(()));
        assert_eq!(
            verify(KEY, &t, "j-1", "pca/0/train/data.bin", 1_000),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn refusals() {
        let t = issue(KEY, "j-1", "a/b", 1_000);
        let check = |token: &str, job: &str, path: &str, want: TokenError| {
            assert_eq!(
                verify(KEY, token, job, path, 10),
                Err(want),
                "{token} {job} {path}"
            );
        };
        check(&t, "j-1", "a/c", TokenError::BadSignature);
        check(&t, "j-2", "a/b", TokenError::BadSignature);
        check(&t, "j-1", "a/b/", TokenError::BadSignature);
        check(
            &t.replace("1000", "9999"),
            "j-1",
            "a/b",
            TokenError::BadSignature,
        );
        check("", "j-1", "a/b", TokenError::Malformed);
        check("v1.12.zz", "j-1", "a/b", TokenError::Malformed);
        check("v2.12.00", "j-1", "a/b", TokenError::Malformed);
        check(&format!("{t}.00"), "j-1", "a/b", TokenError::Malformed);
        check("v1.-1.00", "j-1", "a/b", TokenError::Malformed);
        check("v1.+1.00", "j-1", "a/b", TokenError::Malformed);
        assert_eq!(
            verify(b"another key", &t, "j-1", "a/b", 10),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn field_boundaries_do_not_collide() {
        // Without length prefixes ("j", "1/a") and ("j1", "/a") could share a message.
        let t = issue(KEY, "j", "1/a", 100);
        assert_eq!(
            verify(KEY, &t, "j1", "/a", 0),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn prefix_token_opens_only_its_folder() {
        let t = issue_prefix(KEY, "j-1", "train/0", 100);
        assert_eq!(verify(KEY, &t, "j-1", "train/0/model.bin", 5), Ok(()));
        assert_eq!(verify(KEY, &t, "j-1", "train/0/x/y", 5), Ok(()));
        assert_eq!(
            verify(KEY, &t, "j-1", "train/01/model.bin", 5),
            Err(TokenError::OutOfScope)
        );
        assert_eq!(
            verify(KEY, &t, "j-1", "train/0", 5),
            Err(TokenError::OutOfScope)
        );
        assert_eq!(
            verify(KEY, &t, "j-2", "train/0/m", 5),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            verify(KEY, &t, "j-1", "train/0/m", 100),
            Err(TokenError::Expired)
        );
        // An exact token never acts as a prefix token, and the reverse.
        let exact = issue(KEY, "j-1", "train/0/", 100);
        assert_eq!(
            verify(KEY, &exact, "j-1", "train/0/m", 5),
            Err(TokenError::BadSignature)
        );
        let whole = issue_prefix(KEY, "j-1", "", 100);
        assert_eq!(verify(KEY, &whole, "j-1", "anything/at/all", 5), Ok(()));
    }
}
