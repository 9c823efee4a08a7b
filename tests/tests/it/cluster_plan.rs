//! `deploy/cluster.sh up --dry-run` (interfaces.md §4): the arguments it takes or refuses, and
//! what each agent container would get, scaled or time-dilated (`--dilation D`: CPU quota vCPUs /
//! D, network rate / D, memory unchanged, the store's share of the link D times slower and a delay
//! line of the catalog's latency x D in front of it; `auto` leaves a core outside the agents'
//! quotas), without Docker: no container starts; the memory tier's container (sonic-redis: its
//! link at the tier's network_mbps / D, its --maxmemory, the delay line of its latency x D in
//! every agent); and the delay line itself. Needs bash and python3 (as cluster.sh does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cluster.sh up --dry-run ARGS` on a machine of 2 cores: (exit code, stdout, stderr).
fn dry_run(args: &[&str]) -> (i32, String, String) {
    dry_run_on(2, args)
}

/// `cluster.sh up --dry-run ARGS` on a machine of `cores` cores.
fn dry_run_on(cores: u32, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("bash")
        .arg(root().join("deploy/cluster.sh"))
        .args(["up", "--dry-run"])
        .args(args)
        .env("SONIC_CLUSTER_CORES", cores.to_string())
        .output()
        .expect("run bash deploy/cluster.sh (needs bash and python3)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plan(args: &[&str]) -> Value {
    let (code, out, err) = dry_run(args);
    assert_eq!(code, 0, "cluster.sh up --dry-run {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

/// (vm_type, cpus, memory limit MB, network Mbit/s) of every agent.
fn agents(p: &Value) -> Vec<(String, f64, u64, f64)> {
    p["agents"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            assert_eq!(a["name"], format!("sonic-agent-{}", i + 1));
            (
                a["vm_type"].as_str().unwrap().to_owned(),
                a["cpus"].as_f64().unwrap(),
                a["memory_limit_mb"].as_u64().unwrap(),
                a["network_mbps"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn dilation_divides_cpu_network_and_store_and_keeps_memory() {
    // One agent per VM, in the order asked; D = 4 as asked.
    let p = plan(&["--vms", "m5.large:2,m5.xlarge:1", "--dilation", "4"]);
    assert!(close(&p["dilation"], 4.0) && p["scale"].is_null(), "{p}");
    assert_eq!(p["vcpus"], 8);
    let want = [
        ("m5.large", 0.5, 8192, 187.5),
        ("m5.large", 0.5, 8192, 187.5),
        ("m5.xlarge", 1.0, 16384, 312.5),
    ];
    let got = agents(&p);
    assert_eq!(got.len(), 3);
    for ((vm, cpus, mem, net), (wvm, wcpus, wmem, wnet)) in got.iter().zip(want) {
        assert_eq!((vm.as_str(), *mem), (wvm, wmem));
        assert!(
            (cpus - wcpus).abs() < 1e-9 && (net - wnet).abs() < 1e-9,
            "{got:?}"
        );
    }
    // The quota over a 10 ms period, not Docker's 100 ms (a burst shorter than the share of a
    // period would run undilated).
    for a in p["agents"].as_array().unwrap() {
        let (period, quota) = (&a["cpu_period_us"], &a["cpu_quota_us"]);
        assert!(close(period, 10_000.0), "{a}");
        assert!(close(quota, a["cpus"].as_f64().unwrap() * 10_000.0), "{a}");
    }
    // The catalog's store (600/400 Mbit/s for one VM) four times slower, for every agent, on
    // links the kernel shapes; its latency is the store's own (nothing adds 25 ms x 4).
    assert_eq!(p["links"], "kernel", "{p}");
    for a in p["agents"].as_array().unwrap() {
        let s = &a["store"];
        assert!(s["request_latency_ms"].is_null(), "{s}");
        // The catalog's 25 ms, dilated, is a delay line's: a plain delay in front of the store.
        assert!(close(&a["store_delay_ms"], 100.0), "{a}");
        assert!(
            close(&s["write_mbps"], 150.0) && close(&s["read_mbps"], 100.0),
            "{s}"
        );
    }

    // auto: the agents' vCPUs (the default four agents: 2+4+8+2) fit the 2 cores less one
    // (left to the store and the control plane, which are not dilated) at D = 16.
    let p = plan(&["--dilation", "auto"]);
    assert!(close(&p["dilation"], 16.0), "{p}");
    let cpus: f64 = agents(&p).iter().map(|a| a.1).sum();
    assert!((cpus - 1.0).abs() < 1e-9, "{p}");
    assert!(
        close(&p["agent_cpus"], 1.0) && close(&p["free_cores"], 1.0),
        "{p}"
    );
    // The dilation check's cluster (4 vCPUs): D = 4 leaves a core; D = 2, asked for, leaves none.
    let p = plan(&["--vms", "m5.large:2", "--dilation", "auto"]);
    assert!(
        close(&p["dilation"], 4.0) && close(&p["free_cores"], 1.0),
        "{p}"
    );
    let p = plan(&["--vms", "m5.large:2", "--dilation", "2"]);
    assert!(close(&p["free_cores"], 0.0), "{p}");
    // A cluster that fits as it is is not dilated below 1.
    let (code, out, err) = dry_run_on(4, &["--vms", "m5.large:1", "--dilation", "auto"]);
    assert_eq!(code, 0, "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert!(
        close(&p["dilation"], 1.0) && close(&p["free_cores"], 2.0),
        "{p}"
    );
    // On one core nothing can be left: the agents get it.
    let (code, out, err) = dry_run_on(1, &["--vms", "m5.large:1", "--dilation", "auto"]);
    assert_eq!(code, 0, "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert!(close(&p["dilation"], 2.0), "{p}");
}

#[test]
fn without_dilation_the_scale_is_as_before() {
    let p = plan(&["--agents", "4"]);
    assert!(p["dilation"].is_null() && close(&p["scale"], 0.125), "{p}");
    let got = agents(&p);
    let types: Vec<&str> = got.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(types, ["m5.large", "m5.xlarge", "m5.2xlarge", "t2.large"]);
    // Memory scales with --scale (not with --dilation); the store is left as it is.
    assert_eq!(got[0].2, 1024);
    assert!(p["agents"][0]["store"].is_null());
    assert!(
        close(&p["agents"][0]["store_delay_ms"], 0.0),
        "no delay line: {p}"
    );
    let p = plan(&["--agents", "2", "--store-delay-ms", "10"]);
    assert!(close(&p["agents"][1]["store_delay_ms"], 10.0), "{p}");
    let (code, _, err) = dry_run(&["--store-delay-ms", "-3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--store-delay-ms"), "{err}");
    assert!(p["agents"][0]["cpu_period_us"].is_null(), "{p}");
    let p = plan(&["--agents", "5", "--scale", "0.5"]);
    assert_eq!(agents(&p)[4].0, "m5.large");
    assert!(
        close(&p["agents"][2]["cpus"], 2.0),
        "capped at the cores: {p}"
    );
    assert_eq!(p["agents"][2]["cpus_capped"], true);
}

#[test]
fn refuses_bad_arguments_with_exit_2() {
    for args in [
        &["--vms", "m5.huge:1"][..],
        &["--vms", "m5.large"],
        &["--vms", "m5.large:0"],
        &["--vms", "m5.large:2,"],
        &["--agents", "2", "--vms", "m5.large:1"],
        &["--dilation", "0.5"],
        &["--dilation", "x"],
        &["--dilation", "nan"],
        &["--scale", "0.5", "--dilation", "2"],
        &["--dilation"],
        &["--agents", "0"],
    ] {
        let (code, out, err) = dry_run(args);
        assert_eq!(code, 2, "{args:?} was not refused: {out}{err}");
        assert!(err.contains("cluster:"), "{args:?}: no reason given: {err}");
        assert!(out.is_empty(), "{args:?}: printed a plan: {out}");
    }
}

/// The memory tier's container: on by default, at the built-in tier's figures (those of
/// `MemoryTier::default()`, which the control plane prices when the catalog has none) or the
/// catalog's `memory_tier`; its link at network_mbps / D whatever `--scale` (the control plane
/// plans with the tier's own figure, dilated only); `--maxmemory` the catalog's capacity, else
/// 512 MB, else `--memory-tier-mb`; a delay line of its latency x D in every agent on a dilated
/// cluster (`--memory-delay-ms` x D otherwise, none by default); none with `--no-memory-tier`.
#[test]
fn the_memory_tier_is_a_host_with_the_catalogs_link() {
    let builtin = sonic_core::catalog::MemoryTier::default();
    let tier_of = |p: &Value| -> Value {
        assert!(p["memory_tier"].is_object(), "{p}");
        assert_eq!(p["memory_tier"]["name"], "sonic-redis", "{p}");
        assert_eq!(p["memory_tier"]["url"], "redis://sonic-redis:6379", "{p}");
        p["memory_tier"].clone()
    };
    let delays = |p: &Value| -> Vec<f64> {
        p["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["memory_delay_ms"].as_f64().unwrap())
            .collect()
    };

    // Plain (scaled to the 2 cores): the built-in tier, not scaled, no delay, 512 MB.
    let p = plan(&["--agents", "2"]);
    let m = tier_of(&p);
    assert_eq!(m["catalog"], "built-in", "{m}");
    assert!(close(&m["network_mbps"], builtin.network_mbps), "{m}");
    assert_eq!(m["capacity_mb"], builtin.capacity_mb, "{m}");
    assert_eq!(
        (m["maxmemory_mb"].as_u64(), m["maxmemory_from"].as_str()),
        (Some(512), Some("default")),
        "{m}"
    );
    assert!(close(&m["delay_ms"], 0.0), "{m}");
    assert_eq!(delays(&p), [0.0, 0.0], "{p}");

    // Dilated: network / D, a delay line of the latency x D in every agent.
    let p = plan(&["--vms", "m5.large:2", "--dilation", "16"]);
    let m = tier_of(&p);
    assert!(
        close(&m["network_mbps"], builtin.network_mbps / 16.0),
        "{m}"
    );
    let delay = builtin.request_latency_ms * 16.0;
    assert!(close(&m["delay_ms"], delay), "{m}");
    assert_eq!(delays(&p), [delay, delay], "{p}");

    // A catalog that prices a tier: its figures, its capacity as --maxmemory.
    let dir = std::env::temp_dir().join(format!("sonic-cluster-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = dir.join("catalog.yaml");
    let mut text = std::fs::read_to_string(root().join("deploy/catalog.yaml")).unwrap();
    text.push_str(
        "\nmemory_tier:\n  usd_per_hour: 0.1\n  capacity_mb: 2048\n  network_mbps: 500\n  request_latency_ms: 1.5\n  requests_per_s: 50000\n",
    );
    std::fs::write(&catalog, &text).unwrap();
    // The control plane takes that catalog.
    sonic_core::catalog::Catalog::from_yaml(&text).unwrap();
    let path = catalog.to_str().unwrap();
    let p = plan(&["--agents", "2", "--dilation", "4", "--catalog", path]);
    let m = tier_of(&p);
    assert_eq!(m["catalog"], "catalog", "{m}");
    assert!(close(&m["network_mbps"], 125.0), "{m}");
    assert_eq!(
        (m["maxmemory_mb"].as_u64(), m["maxmemory_from"].as_str()),
        (Some(2048), Some("catalog")),
        "{m}"
    );
    assert!(close(&m["delay_ms"], 6.0), "{m}");
    // Given: --memory-tier-mb and --memory-delay-ms (emulated: x D).
    let p = plan(&[
        "--agents",
        "2",
        "--dilation",
        "4",
        "--catalog",
        path,
        "--memory-tier-mb",
        "64",
        "--memory-delay-ms",
        "2",
    ]);
    let m = tier_of(&p);
    assert_eq!(m["maxmemory_mb"], 64, "{m}");
    assert!(close(&m["delay_ms"], 8.0), "{m}");
    assert_eq!(delays(&p), [8.0, 8.0], "{p}");
    let _ = std::fs::remove_dir_all(&dir);

    // None.
    let p = plan(&["--agents", "2", "--dilation", "4", "--no-memory-tier"]);
    assert!(p["memory_tier"].is_null(), "{p}");
    assert_eq!(delays(&p), [0.0, 0.0], "{p}");
    for args in [
        &["--memory-tier-mb", "0"][..],
        &["--memory-tier-mb", "1.5"],
        &["--memory-delay-ms", "-1"],
        &["--memory-delay-ms", "x"],
        &["--no-memory-tier", "--memory-tier-mb", "64"],
        &["--memory-tier-mb"],
    ] {
        let (code, out, err) = dry_run(args);
        assert_eq!(code, 2, "{args:?} was not refused: {out}{err}");
        assert!(err.contains("cluster:"), "{args:?}: no reason given: {err}");
        assert!(out.is_empty(), "{args:?}: printed a plan: {out}");
    }
}

/// `deploy/dilation-breakdown.py` on two factors' job summaries (as `dilation-check.sh` keeps
/// them): each part's mean real seconds, and which part grew with D and which did not.
#[test]
fn the_breakdown_tells_dilated_parts_from_fixed_ones() {
    let dir = std::env::temp_dir().join(format!("sonic-breakdown-{}", std::process::id()));
    for d in [4.0_f64, 8.0] {
        let sums = dir.join(format!("D={d}")).join("summaries");
        std::fs::create_dir_all(&sums).unwrap();
        // A lambda of 0.2 s x D then one of 0.5 s x D, each with 0.1 s x D of staging; 0.5 s
        // before the first dispatch and 0.3 s between the stages that do not dilate, 0.2 s of
        // them b's stage fetch (agents' work, no instance out: not the control plane's).
        let s = serde_json::json!({
            "job_id": "j", "policy": "remote", "status": "succeeded",
            "latency_s": 0.5 + 0.3 * d + 0.3 + 0.6 * d + 0.2,
            "edges": [{"from": "a", "to": "b", "method": "remote", "bytes": 1, "seconds": 0.1 * d}],
            "functions": [
                {"name": "a", "instance": 0, "seconds": 0.2 * d, "started_s": 0.5,
                 "ended_s": 0.5 + 0.3 * d},
                {"name": "b", "instance": 0, "seconds": 0.5 * d, "started_s": 0.8 + 0.3 * d,
                 "ended_s": 0.8 + 0.9 * d},
            ],
            "fetches": [{"function": "b", "agent": "x", "started_s": 0.5 + 0.3 * d,
                         "ended_s": 0.7 + 0.3 * d, "bytes": 1}],
        });
        std::fs::write(sums.join("j.json"), s.to_string()).unwrap();
    }
    let out = Command::new("python3")
        .arg(root().join("deploy/dilation-breakdown.py"))
        .arg(&dir)
        .args(["4", "8"])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(dir.join("breakdown.csv")).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "policy,dilation,jobs,latency_real_s,control_real_s,agents_real_s,before_real_s,exec_real_s,run_real_s,between_real_s,fetch_real_s,after_real_s,edge_max_real_s,emulated_all_divided_s,emulated_s"
    );
    // D = 4: latency 0.5 + 1.2 + 0.3 + 2.4 + 0.2; no instance out and no fetch for
    // 0.5 + 0.1 + 0.2 s (the control plane's), the agents' 3.8 s; exec 0.8 + 2.0; run 0.4 + 0.4;
    // the fetch 0.2; emulated 4.6 / 4 with all of it divided, 0.8 + 3.8 / 4 with the control
    // plane's part not.
    assert_eq!(
        lines[1],
        "remote,4,1,4.6000,0.8000,3.8000,0.5000,2.8000,0.8000,0.3000,0.2000,0.2000,0.4000,1.1500,1.7500"
    );
    assert!(
        lines[2].starts_with(
            "remote,8,1,8.2000,0.8000,7.4000,0.5000,5.6000,1.6000,0.3000,0.2000,0.2000"
        ),
        "{}",
        lines[2]
    );
    assert!(lines[2].ends_with(",1.0250,1.7250"), "{}", lines[2]);
    assert!(
        stdout.contains("before=1.00")
            && stdout.contains("exec=2.00")
            && stdout.contains("between=1.00")
            && stdout.contains("fetch=1.00")
            && stdout.contains("control=1.00")
            && stdout.contains("agents=1.95")
            && stdout.contains(" emul=0.99"),
        "{stdout}"
    );
}

/// The testbed's delay line (`deploy/images/sonic-delay.py`, started by sonic-link in front of
/// the store): bytes pass through it unchanged both ways, and a reply to what a client sent
/// comes no sooner than the delay after it was sent (a lower bound, which cannot flake: the line
/// holds every byte at least that long). Then it closes the client's side when the server closes.
#[test]
fn the_delay_line_holds_what_clients_send_and_passes_it_whole() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    // An echo server.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let server_port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = server.accept() {
            let mut buf = [0u8; 65536];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut line = Command::new("python3")
        .arg(root().join("deploy/images/sonic-delay.py"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--to", &format!("127.0.0.1:{server_port}")])
        .args(["--delay-ms", "300"])
        .spawn()
        .expect("python3 runs sonic-delay.py");
    let mut client = None;
    for _ in 0..100 {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                client = Some(s);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let mut client = client.expect("the delay line listens");
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sent = Instant::now();
    client.write_all(&data).unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    let mut first = None;
    let mut buf = [0u8; 65536];
    loop {
        let n = client.read(&mut buf).expect("the echo comes back");
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        back.extend_from_slice(&buf[..n]);
    }
    let _ = line.kill();
    let _ = line.wait();
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
    let waited = first.unwrap().duration_since(sent);
    assert!(
        waited >= Duration::from_millis(300),
        "the first byte came back {waited:?} after it was sent, before the 300 ms the line holds it"
    );
    // Bad arguments: a clear refusal, nothing started.
    let out = Command::new("python3")
        .arg(root().join("deploy/images/sonic-delay.py"))
        .args([
            "--listen",
            "nowhere",
            "--to",
            "127.0.0.1:1",
            "--delay-ms",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOST:PORT"));
}
