//! A `redis-server` of a test's own (the memory tier's tests: sonic-storage's store, the agent's
//! `memory` transfers, the control plane's jobs). Debian's `redis-server` must be installed: a
//! test that needs it fails, saying so, when it is not.

use std::time::{Duration, Instant};

pub const NEED_REDIS: &str = "the Redis tests start their own: install Debian's redis-server package (`sudo apt-get install redis-server`)";

/// A `redis-server` of the test's own on a free port of 127.0.0.1, without persistence; killed
/// when dropped, so also when the test panics.
pub struct RedisServer {
    child: Option<std::process::Child>,
    port: u16,
    extra: Vec<String>,
    dir: tempfile::TempDir,
    starts: u32,
}

impl RedisServer {
    /// Starts a server with `extra` arguments (`--maxmemory 1mb`, ...) and waits until it answers.
    pub fn start(extra: &[&str]) -> RedisServer {
        let mut last = String::new();
        // A free port may be taken between finding it and the server binding it: try a few.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .expect("a free port")
                .local_addr()
                .expect("a free port")
                .port();
            let mut server = RedisServer {
                child: None,
                port,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                dir: tempfile::tempdir().expect("a scratch folder"),
                starts: 0,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start: {last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        self.starts += 1;
        let log = self.dir.path().join(format!("redis-{}.log", self.starts));
        let spawned = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => self.child.insert(child),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("redis-server is not on PATH; {NEED_REDIS}")
            }
            Err(e) => panic!("cannot run redis-server: {e}; {NEED_REDIS}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("the server's status") {
                self.child = None;
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "redis-server on port {} exited with {status}; its log:\n{log}",
                    self.port
                ));
            }
            if redis_answers(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer PING within 10 s",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> String {
        self.child
            .as_ref()
            .expect("the server runs")
            .id()
            .to_string()
    }

    /// Sends a signal (`-STOP`, `-CONT`) to the server.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed: {status}");
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing persists).
    pub fn restart(&mut self) {
        self.kill();
        if let Err(why) = self.spawn() {
            panic!("redis-server did not restart: {why}");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a Redis server on `port` answers PING.
pub fn redis_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut sock) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = sock.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 16];
    sock.write_all(b"PING\r\n").is_ok()
        && sock
            .read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}
