//! Bandwidth like a VM's: two agents on loopback with different limits each get their own, one
//! agent's egress limiter is shared by all its streams, and the meters report what was obtained.
//!
//! This is the one rate measurement the data plane's issue asks for: bytes over elapsed time, with
//! a 15% tolerance, on transfers of about 0.8 s each (long enough that a scheduling hiccup of a busy
//! machine does not dominate, short enough to keep the test at a few seconds).

use std::time::Instant;

use crate::transfer_support::*;
use sonic_agent::throttle::AgentThrottle;
use sonic_agent::transfer::fetch_direct;

/// Moved at 40 MB/s (and as two halves at once); twice as much at 80 MB/s.
const SIZE: usize = 32 << 20;
const TOLERANCE: f64 = 0.15;

fn assert_near(what: &str, got: f64, limit: f64) {
    let ratio = got / limit;
    eprintln!("{what}: {:.1} MB/s (limit {:.1})", got / 1e6, limit / 1e6);
    assert!(
        (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio),
        "{what}: {:.1} MB/s against a limit of {:.1} MB/s",
        got / 1e6,
        limit / 1e6
    );
}

/// `to` fetches `path` (of `size` bytes) from `from`; returns the bytes per second it saw.
async fn fetch(
    http: &reqwest::Client,
    from: &TestAgent,
    to: &TestAgent,
    path: &str,
    size: usize,
    dest: &str,
) -> f64 {
    let dest = to.files.prepare_write(&job(), &fpath(dest)).expect("dest");
    let t0 = Instant::now();
    let stats = fetch_direct(
        http,
        &from.url,
        JOB,
        path,
        &token(path),
        &dest,
        Some(&to.throttle.storage_throttle()),
        &to.meter,
    )
    .await
    .expect("fetch");
    let rate = stats.bytes as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(stats.bytes, size as u64);
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_their_own_limits_and_share_them_across_streams() {
    let (a_limit, b_limit) = (40e6, 80e6);
    let a = TestAgent::start(AgentThrottle::from_bytes_per_sec(
        Some(a_limit),
        Some(a_limit),
    ))
    .await;
    let b = TestAgent::start(AgentThrottle::from_bytes_per_sec(
        Some(b_limit),
        Some(b_limit),
    ))
    .await;
    let c = TestAgent::start(AgentThrottle::unlimited()).await;
    let content = data(1, 2 * SIZE);
    a.put("src/0/dst/big", &content[..SIZE]);
    a.put("src/1/dst/big", &content[..SIZE / 2]);
    a.put("src/2/dst/big", &content[SIZE / 2..SIZE]);
    c.put("src/0/dst/big", &content);
    let http = sonic_agent::transfer::http_client(None).expect("client");

    // B fetches from A: A's egress (40 MB/s) is the bottleneck.
    let rate = fetch(&http, &a, &b, "src/0/dst/big", SIZE, "from-a").await;
    assert_near("A -> B (A's egress)", rate, a_limit);
    let a_seen = a
        .meter
        .snapshot()
        .egress_bps
        .expect("A measured its egress");
    assert_near("A's egress meter", a_seen, a_limit);

    // B fetches from the unlimited C: B's ingress (80 MB/s) is the bottleneck.
    let rate = fetch(&http, &c, &b, "src/0/dst/big", 2 * SIZE, "from-c").await;
    assert_near("C -> B (B's ingress)", rate, b_limit);
    let b_seen = b.meter.snapshot();
    assert_eq!(b_seen.ingress_samples, 2);
    // The moving average mixes the 40 and 80 MB/s samples, newest weighing more.
    let ingress = b_seen.ingress_bps.expect("B measured its ingress");
    assert!(ingress > a_limit && ingress < b_limit, "{ingress}");

    // Two streams out of A at once share its one egress limiter: together 40 MB/s, not 80.
    let t0 = Instant::now();
    let (r1, r2) = tokio::join!(
        fetch(&http, &a, &c, "src/1/dst/big", SIZE / 2, "half-1"),
        fetch(&http, &a, &c, "src/2/dst/big", SIZE / 2, "half-2"),
    );
    let aggregate = SIZE as f64 / t0.elapsed().as_secs_f64();
    assert_near("two streams out of A", aggregate, a_limit);
    assert!(r1 < a_limit * 0.75 && r2 < a_limit * 0.75, "{r1} {r2}");
}
