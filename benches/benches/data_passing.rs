//! Throughput of the three ways to pass a file, unthrottled, against `cp` of the same file.
//!
//! `cargo bench -p sonic-benches --bench data_passing [-- --sizes 1,16,256,1024] [--only direct]`
//! (sizes in MiB, or set `SONIC_BENCH_SIZES_MIB`; `--only` runs one method, for profiling). Per size:
//! - `vm-storage`: `FileStore::link` (a hard link, namespace checks included): its time, which must
//!   not grow with the size;
//! - `direct`: a fetch through a real file server on 127.0.0.1 and the real client (streaming,
//!   hashing, atomic rename);
//! - `remote`: upload then download through S3 at `SONIC_S3_ENDPOINT` when set (credentials
//!   `SONIC_S3_ACCESS_KEY`/`SONIC_S3_SECRET_KEY`, default `sonic`/`sonicsecret`), else through a
//!   `LocalStore` (said in the output);
//! - `cp`: the system's `cp` of the same file (page cache to page cache, like every other column).
//!
//! Methods take turns for 3 to 7 rounds; throughputs are the best round (on a shared machine, the
//! one least disturbed by other work), with the median of `direct` beside it.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sonic_agent::files::{FilePath, FileStore, JobId};
use sonic_agent::fileserver::{self, FileServerState};
use sonic_agent::throttle::{AgentThrottle, BandwidthMeter};
use sonic_agent::transfer::{download_remote, fetch_direct, http_client, upload_remote};
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;
use sonic_storage::s3::{S3Config, S3Store};

const KEY: &[u8] = b"bench-file-key-0123456789abcdef";
const MIB: u64 = 1 << 20;

/// Pseudo-random bytes (xorshift), so nothing along the way can shortcut on the content.
struct Pattern {
    left: u64,
    state: u64,
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            chunk.copy_from_slice(&self.state.to_le_bytes()[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The value after `--<name>` on the command line (cargo bench passes `--bench` too: anything
/// else is ignored).
fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn sizes() -> anyhow::Result<Vec<u64>> {
    let spec = arg("--sizes").or_else(|| std::env::var("SONIC_BENCH_SIZES_MIB").ok());
    let spec = spec.unwrap_or_else(|| "1,16,256,1024".to_owned());
    spec.split(',')
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .map(|m| m * MIB)
                .with_context(|| format!("bad size {s:?} in --sizes (MiB, comma-separated)"))
        })
        .collect()
}

/// What one size measured, per method (empty when the method was not run).
#[derive(Default)]
struct Measured {
    link: Vec<f64>,
    direct: Vec<f64>,
    cp: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The best (highest) throughput: on a shared machine, the run least disturbed by other work.
fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

async fn remote_store(scratch: &Path) -> anyhow::Result<(Box<dyn ObjectStore>, String)> {
    match std::env::var("SONIC_S3_ENDPOINT") {
        Ok(endpoint) => {
            let access =
                std::env::var("SONIC_S3_ACCESS_KEY").unwrap_or_else(|_| "sonic".to_owned());
            let secret =
                std::env::var("SONIC_S3_SECRET_KEY").unwrap_or_else(|_| "sonicsecret".to_owned());
            let bucket = format!("sonic-bench-{}", std::process::id());
            let store = S3Store::new(S3Config::new(endpoint.clone(), bucket, access, secret))?;
            store
                .ensure_bucket()
                .await
                .with_context(|| format!("S3 at {endpoint}"))?;
            Ok((Box::new(store), format!("S3 at {endpoint}")))
        }
        Err(_) => Ok((
            Box::new(LocalStore::new(scratch.join("store"))?),
            "LocalStore (SONIC_S3_ENDPOINT not set)".to_owned(),
        )),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes = sizes()?;
    let only = arg("--only");
    let run = |method: &str| only.as_deref().is_none_or(|o| o == method);
    let scratch = tempfile::tempdir()?;
    let a = FileStore::open(&scratch.path().join("a"))?;
    let b = FileStore::open(&scratch.path().join("b"))?;
    let meter = BandwidthMeter::default();
    let throttle = AgentThrottle::unlimited();
    let (addr, _server) = fileserver::spawn_standalone(
        "127.0.0.1:0".parse()?,
        FileServerState {
            files: a.clone(),
            key: KEY.to_vec(),
            throttle: throttle.storage_throttle(),
            meter: meter.clone(),
        },
    )
    .await?;
    let url = format!("http://{addr}");
    let http = http_client(None)?;
    let (store, store_name) = remote_store(scratch.path()).await?;
    let job = JobId::parse("j-bench")?;
    let cp_dir = scratch.path().join("cp");
    std::fs::create_dir_all(&cp_dir)?;

    println!("data passing, unthrottled, files in the page cache; remote through {store_name}");
    println!("throughputs are the best of the runs (methods take turns); vm-storage is the median");
    println!(
        "{:>9} | {:>14} | {:>12} | {:>12} | {:>9} | {:>14} | {:>16} | {:>14}",
        "size",
        "vm-storage µs",
        "direct MB/s",
        "cp MB/s",
        "cp/direct",
        "remote up MB/s",
        "remote down MB/s",
        "direct median"
    );
    for size in sizes {
        let src = FilePath::parse(&format!("src/0/dst/{size}.bin"))?;
        {
            let (a, job, src) = (a.clone(), job.clone(), src.clone());
            tokio::task::spawn_blocking(move || {
                a.write_atomic_from(
                    &job,
                    &src,
                    Pattern {
                        left: size,
                        state: size | 1,
                    },
                )
            })
            .await??;
        }
        let src_path = a.resolve(&job, &src)?;
        let reps = (256 * MIB / size.max(1)).clamp(3, 7) as usize;
        let token = sonic_api::token::issue(KEY, job.as_str(), src.as_str(), u64::MAX);
        let key = format!("bench/{size}.bin");
        let mut m = Measured::default();
        // The methods take turns, so a burst of load from elsewhere hits them alike.
        for i in 0..reps {
            if run("vm-storage") {
                let dst = FilePath::parse(&format!("in/{size}/{i}.bin"))?;
                let t0 = Instant::now();
                a.link(&job, &src, &job, &dst)?;
                m.link.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            if run("direct") {
                let dest = b.prepare_write(&job, &FilePath::parse(&format!("d/{size}/{i}"))?)?;
                let t0 = Instant::now();
                let stats = fetch_direct(
                    &http,
                    &url,
                    job.as_str(),
                    src.as_str(),
                    &token,
                    &dest,
                    Some(&throttle.storage_throttle()),
                    &meter,
                )
                .await?;
                m.direct.push(mbps(stats.bytes, t0.elapsed()));
                std::fs::remove_file(&dest)?;
            }
            if run("cp") {
                let dest = cp_dir.join("copy");
                let t0 = Instant::now();
                let status = Command::new("cp").arg(&src_path).arg(&dest).status()?;
                let elapsed = t0.elapsed();
                if !status.success() {
                    bail!("cp failed: {status}");
                }
                m.cp.push(mbps(size, elapsed));
                std::fs::remove_file(&dest)?;
            }
            if run("remote") && i < 3 {
                let t0 = Instant::now();
                upload_remote(store.as_ref(), &key, &src_path).await?;
                m.up.push(mbps(size, t0.elapsed()));
                let dest = b.prepare_write(&job, &FilePath::parse(&format!("r/{size}/{i}"))?)?;
                let t0 = Instant::now();
                download_remote(store.as_ref(), &key, &dest).await?;
                m.down.push(mbps(size, t0.elapsed()));
                std::fs::remove_file(&dest)?;
            }
        }
        if run("remote") {
            store.delete(&key).await?;
        }
        let (direct, cp) = (best(&m.direct), best(&m.cp));
        println!(
            "{:>5} MiB | {:>14.1} | {:>12.0} | {:>12.0} | {:>9.2} | {:>14.0} | {:>16.0} | {:>14.0}",
            size / MIB,
            median(&m.link),
            direct,
            cp,
            cp / direct,
            best(&m.up),
            best(&m.down),
            median(&m.direct),
        );
        a.delete_job(&job)?;
        b.delete_job(&job)?;
    }
    let snap = meter.snapshot();
    println!(
        "meter (EWMA of completed transfers, MB/s): egress {:.0}, ingress {:.0}, {} samples",
        snap.egress_bps.unwrap_or_default() / 1e6,
        snap.ingress_bps.unwrap_or_default() / 1e6,
        snap.samples
    );
    Ok(())
}
