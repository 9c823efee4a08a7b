//! The file server refuses everything it should, over a real socket, and serves nothing then:
//! missing, wrong, expired and other-path tokens; `..` traversal, plain and percent-encoded, in the
//! path and in the job id; symlinks planted in the namespace (to a file, to a folder, and swapped in
//! for a registered file); unregistered and modified files. Also the happy path's headers and
//! `Range` answers.

use crate::transfer_support::*;
use sonic_agent::throttle::{AgentThrottle, BandwidthMeter};
use sonic_agent::transfer::{TransferError, fetch_direct};

const SECRET: &[u8] = b"TOP-SECRET-OUTSIDE-THE-NAMESPACE";

struct Setup {
    agent: TestAgent,
    /// Outside the agent's data dir.
    outside: tempfile::TempDir,
}

async fn setup() -> Setup {
    let agent = TestAgent::start(AgentThrottle::unlimited()).await;
    agent.put("pca/0/train/data.bin", b"public content");
    let outside = tempfile::tempdir().expect("tempdir");
    std::fs::write(outside.path().join("secret"), SECRET).expect("secret");
    std::fs::create_dir(outside.path().join("dir")).expect("dir");
    std::fs::write(outside.path().join("dir/secret"), SECRET).expect("secret");
    Setup { agent, outside }
}

/// Asserts a refusal: the status, a JSON `error` body, and no byte of the secret.
fn refused(resp: &RawResponse, status: u16, what: &str) {
    assert_eq!(resp.status, status, "{what}: {}", resp.head);
    let body: serde_json::Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {:?}", resp.body));
    assert!(body["error"].is_string(), "{what}: {body}");
    assert!(
        !resp.body.windows(SECRET.len()).any(|w| w == SECRET),
        "{what}: leaked the secret"
    );
    assert!(
        !String::from_utf8_lossy(&resp.body).contains('/'),
        "{what}: a path in the error body: {body}"
    );
}

#[tokio::test]
async fn serves_a_registered_file_with_checksum_and_ranges() {
    let s = setup().await;
    let path = "pca/0/train/data.bin";
    let meta = s
        .agent
        .files
        .meta(&job(), &fpath(path))
        .expect("meta")
        .expect("registered");
    let target = format!("/v1/files/{JOB}/{path}");
    let tok = token(path);

    let full = raw_get(s.agent.addr, &target, &[("x-sonic-token", &tok)]).await;
    assert_eq!(full.status, 200, "{}", full.head);
    assert_eq!(full.body, b"public content");
    let head = full.head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("x-sonic-checksum: {}", meta.checksum)),
        "{head}"
    );
    assert!(head.contains("content-length: 14"), "{head}");
    assert!(head.contains("accept-ranges: bytes"), "{head}");

    // The token may come as a query parameter.
    let by_query = raw_get(s.agent.addr, &format!("{target}?token={tok}"), &[]).await;
    assert_eq!(by_query.status, 200);

    let part = raw_get(
        s.agent.addr,
        &target,
        &[("x-sonic-token", &tok), ("range", "bytes=7-")],
    )
    .await;
    assert_eq!(part.status, 206, "{}", part.head);
    assert_eq!(part.body, b"content");
    let head = part.head.to_ascii_lowercase();
    assert!(head.contains("content-range: bytes 7-13/14"), "{head}");
    assert!(
        head.contains(&format!("x-sonic-checksum: {}", meta.checksum)),
        "{head}"
    );

    let past = raw_get(
        s.agent.addr,
        &target,
        &[("x-sonic-token", &tok), ("range", "bytes=14-")],
    )
    .await;
    refused(&past, 416, "range past the end");
}

#[tokio::test]
async fn refuses_bad_tokens() {
    let s = setup().await;
    let path = "pca/0/train/data.bin";
    let target = format!("/v1/files/{JOB}/{path}");
    let exp = now() + 3600;
    let cases = [
        ("no token", None),
        ("garbage", Some("not-a-token".to_owned())),
        (
            "another key",
            Some(sonic_api::token::issue(b"some other key!!", JOB, path, exp)),
        ),
        (
            "expired",
            Some(sonic_api::token::issue(KEY, JOB, path, now() - 1)),
        ),
        (
            "another path",
            Some(sonic_api::token::issue(
                KEY,
                JOB,
                "pca/0/train/other.bin",
                exp,
            )),
        ),
        (
            "another job",
            Some(sonic_api::token::issue(KEY, "j-other", path, exp)),
        ),
        (
            "prefix of another folder",
            Some(sonic_api::token::issue_prefix(KEY, JOB, "pca/1/", exp)),
        ),
    ];
    for (what, tok) in cases {
        let headers: Vec<(&str, &str)> = tok
            .as_deref()
            .map(|t| vec![("x-sonic-token", t)])
            .unwrap_or_default();
        let resp = raw_get(s.agent.addr, &target, &headers).await;
        refused(&resp, 403, what);
    }
    // A folder token opens what is under it.
    let folder = sonic_api::token::issue_prefix(KEY, JOB, "pca/0/", exp);
    let ok = raw_get(s.agent.addr, &target, &[("x-sonic-token", &folder)]).await;
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn refuses_traversal_plain_and_encoded() {
    let s = setup().await;
    let data_dir = s.agent.dir.path().to_string_lossy().into_owned();
    // How far up the outside dir is from the job's files dir does not matter: any `..` is refused.
    let outside = s.outside.path().to_string_lossy().into_owned();
    let cases = [
        "../../../../../../../../etc/passwd".to_owned(),
        format!("../../../../../../../..{outside}/secret"),
        "%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd".to_owned(),
        "%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc%2Fpasswd".to_owned(),
        "..%2f..%2f..%2fetc%2fpasswd".to_owned(),
        "pca/0/%2e%2e/%2e%2e/%2e%2e/files.jsonl".to_owned(),
        "pca/./0/train/data.bin".to_owned(),
        "pca//0/train/data.bin".to_owned(),
        "pca%5c..%5c..%5cfiles.jsonl".to_owned(),
        "pca/0/train/data.bin%00.txt".to_owned(),
        format!("%2F{}", outside.trim_start_matches('/')),
        format!(
            "{}/secret",
            outside.trim_start_matches('/').replace('/', "%2F")
        ),
    ];
    for raw in &cases {
        // Even with a genuine token for the decoded path, which the server checks only later.
        let decoded = percent_decode(raw);
        let tok = token(&decoded);
        let resp = raw_get(
            s.agent.addr,
            &format!("/v1/files/{JOB}/{raw}"),
            &[("x-sonic-token", &tok)],
        )
        .await;
        assert!(
            resp.status == 400 || resp.status == 404,
            "{raw}: {}",
            resp.head
        );
        refused(&resp, resp.status, raw);
        assert!(!String::from_utf8_lossy(&resp.body).contains(&data_dir));
    }
    // The job id is checked the same way.
    for job in ["..", "%2e%2e", ".", "j%2f..", "a%00"] {
        let resp = raw_get(
            s.agent.addr,
            &format!("/v1/files/{job}/jobs/{JOB}/files/pca/0/train/data.bin"),
            &[("x-sonic-token", &token("x"))],
        )
        .await;
        refused(&resp, 400, job);
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn refuses_symlinks_planted_in_the_namespace() {
    let s = setup().await;
    let files_dir = s.agent.files.files_dir(&job());
    std::os::unix::fs::symlink(s.outside.path().join("secret"), files_dir.join("evil"))
        .expect("plant file link");
    std::os::unix::fs::symlink(s.outside.path().join("dir"), files_dir.join("evildir"))
        .expect("plant folder link");
    std::os::unix::fs::symlink(s.outside.path(), files_dir.join("pca/up")).expect("plant");

    // The agent itself refuses to register or write through them.
    for p in ["evil", "evildir/secret", "pca/up/secret"] {
        let err = s
            .agent
            .files
            .register_output(&job(), &fpath(p))
            .expect_err("symlink");
        assert!(
            matches!(err, sonic_agent::files::FileError::Escape),
            "{p}: {err}"
        );
    }
    assert!(
        s.agent
            .files
            .write_atomic(&job(), &fpath("evildir/new"), b"x")
            .is_err()
    );
    assert!(!s.outside.path().join("dir/new").exists());

    for p in [
        "evil",
        "evildir/secret",
        "pca/up/secret",
        "pca/up/dir/secret",
    ] {
        let resp = raw_get(
            s.agent.addr,
            &format!("/v1/files/{JOB}/{p}"),
            &[("x-sonic-token", &token(p))],
        )
        .await;
        assert!(
            resp.status == 403 || resp.status == 404,
            "{p}: {}",
            resp.head
        );
        refused(&resp, resp.status, p);
    }

    // A registered file swapped for a symlink afterwards.
    let registered = "pca/0/train/data.bin";
    let real = files_dir.join(registered);
    std::fs::remove_file(&real).expect("remove");
    std::os::unix::fs::symlink(s.outside.path().join("secret"), &real).expect("swap");
    let resp = raw_get(
        s.agent.addr,
        &format!("/v1/files/{JOB}/{registered}"),
        &[("x-sonic-token", &token(registered))],
    )
    .await;
    refused(&resp, 403, "swapped for a symlink");

    // A folder on the way swapped for a symlink to a copy of the tree outside.
    let copy = s.outside.path().join("copy");
    std::fs::create_dir_all(copy.join("0/train")).expect("mkdir");
    std::fs::write(copy.join("0/train/data.bin"), SECRET).expect("write");
    std::fs::rename(files_dir.join("pca"), files_dir.join("pca-moved")).expect("move");
    std::os::unix::fs::symlink(&copy, files_dir.join("pca")).expect("swap folder");
    let resp = raw_get(
        s.agent.addr,
        &format!("/v1/files/{JOB}/{registered}"),
        &[("x-sonic-token", &token(registered))],
    )
    .await;
    refused(&resp, 403, "folder swapped for a symlink");
}

#[tokio::test]
async fn refuses_unregistered_and_modified_files() {
    let s = setup().await;
    let files_dir = s.agent.files.files_dir(&job());
    // Written behind the agent's back (as a lambda still writing would): not visible.
    std::fs::write(files_dir.join("pca/0/train/partial"), b"half").expect("write");
    let resp = raw_get(
        s.agent.addr,
        &format!("/v1/files/{JOB}/pca/0/train/partial"),
        &[("x-sonic-token", &token("pca/0/train/partial"))],
    )
    .await;
    refused(&resp, 404, "unregistered");

    std::fs::write(files_dir.join("pca/0/train/data.bin"), b"rewritten!").expect("write");
    let p = "pca/0/train/data.bin";
    let resp = raw_get(
        s.agent.addr,
        &format!("/v1/files/{JOB}/{p}"),
        &[("x-sonic-token", &token(p))],
    )
    .await;
    refused(&resp, 409, "modified after registration");

    let resp = raw_get(
        s.agent.addr,
        &format!("/v1/files/{JOB}/no/such/file"),
        &[("x-sonic-token", &token("no/such/file"))],
    )
    .await;
    refused(&resp, 404, "missing");
}

#[tokio::test]
async fn the_client_gives_up_at_once_on_a_refusal() {
    let s = setup().await;
    let b = TestAgent::start(AgentThrottle::unlimited()).await;
    let path = "pca/0/train/data.bin";
    let dest = b.files.prepare_write(&job(), &fpath(path)).expect("dest");
    let http = sonic_agent::transfer::http_client(None).expect("client");
    let wrong = token("pca/0/train/other.bin");
    let err = fetch_direct(
        &http,
        &s.agent.url,
        JOB,
        path,
        &wrong,
        &dest,
        None,
        &BandwidthMeter::default(),
    )
    .await
    .expect_err("wrong token");
    assert!(
        matches!(&err, TransferError::Refused { status: 403, message } if message == "forbidden"),
        "{err}"
    );
    assert!(!dest.exists());
    assert!(temp_files(b.dir.path()).is_empty());
}
