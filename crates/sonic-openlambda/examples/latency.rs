//! Hot and cold call latency of an echo handler through `/run/`, against a plain `python3 -c`
//! start (docs/python.md). `cargo run --release -p sonic-openlambda --example latency [hot] [cold]
//! [process|docker]`: the `/run/` workers as host processes (the default) or in containers of
//! `sonic-python:latest`.

use std::time::{Duration, Instant};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn echo_tarball(version: usize) -> Res<Vec<u8>> {
    let script = format!(
        "import tarfile, io, sys\nbuf = io.BytesIO()\nwith tarfile.open(fileobj=buf, mode='w:gz') as tar:\n    data = b'def f(event):\\n    return event  # v{version}\\n'\n    info = tarfile.TarInfo('f.py')\n    info.size = len(data)\n    tar.addfile(info, io.BytesIO(data))\nsys.stdout.buffer.write(buf.getvalue())\n"
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()?;
    Ok(out.stdout)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Res {
    let mut args = std::env::args().skip(1);
    let hot: usize = args.next().map_or(Ok(1000), |s| s.parse())?;
    let cold: usize = args.next().map_or(Ok(50), |s| s.parse())?;
    let sandbox = args.next().unwrap_or_else(|| "process".into());
    let dir = tempfile::tempdir()?;
    let mut cfg =
        sonic_openlambda::OpenLambdaConfig::new(([127, 0, 0, 1], 0).into(), dir.path().into());
    cfg.sandbox = match sandbox.as_str() {
        "process" => sonic_openlambda::WorkerSandbox::Process,
        "docker" => sonic_openlambda::WorkerSandbox::Docker {
            image: "sonic-python:latest".into(),
        },
        other => return Err(format!("unknown sandbox {other}: process or docker").into()),
    };
    let ol = sonic_openlambda::start(cfg).await?;
    let http = reqwest::Client::new();
    let call = |http: &reqwest::Client| {
        let url = format!("{}/run/echo", ol.url());
        let req = http.post(url).body("{\"hello\": \"world\"}");
        async move {
            let t = Instant::now();
            let r = req.send().await?;
            let ok = r.status().is_success();
            let _ = r.bytes().await?;
            if !ok {
                return Err::<Duration, Box<dyn std::error::Error>>("call failed".into());
            }
            Ok(t.elapsed())
        }
    };
    let mut colds = Vec::new();
    for v in 0..cold {
        let r = http
            .post(format!("{}/registry/echo", ol.url()))
            .body(echo_tarball(v)?)
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 201);
        colds.push(call(&http).await?);
    }
    let mut hots = Vec::new();
    for _ in 0..hot {
        hots.push(call(&http).await?);
    }
    let exe = String::from_utf8(
        std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()?
            .stdout,
    )?;
    let mut plain = Vec::new();
    for _ in 0..cold {
        let t = Instant::now();
        let out = std::process::Command::new(exe.trim())
            .args([
                "-c",
                "import json, sys; print(json.dumps(json.loads(sys.argv[1])))",
                "{\"hello\": \"world\"}",
            ])
            .output()?;
        assert!(out.status.success());
        plain.push(t.elapsed());
    }
    println!(
        "echo handler through /run/ ({}, {sandbox} workers; python3 -c with {})",
        env!("CARGO_PKG_NAME"),
        exe.trim()
    );
    println!(
        "hot  /run/  n={hot:<5} p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut hots, 0.5),
        pct(&mut hots, 0.99)
    );
    println!(
        "cold /run/  n={cold:<5} p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut colds, 0.5),
        pct(&mut colds, 0.99)
    );
    println!(
        "python3 -c n={cold:<5} p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut plain, 0.5),
        pct(&mut plain, 0.99)
    );
    ol.stop().await;
    Ok(())
}
