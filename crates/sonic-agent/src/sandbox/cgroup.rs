//! Memory cgroups: where the sandboxes read an instance's peak memory and its out-of-memory kills.
//!
//! cgroup v1 (what this project's machines have) is complete: the peak can be reset before each
//! run, and `memory.oom_control` counts kills. On cgroup v2 `memory.peak` covers the cgroup's
//! whole life, so it only describes a run in a fresh cgroup.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The default mount point of the cgroup hierarchies.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// One memory cgroup (a directory of the memory hierarchy).
#[derive(Debug, Clone)]
pub(crate) struct MemoryCgroup {
    pub dir: PathBuf,
    pub version: Version,
}

impl MemoryCgroup {
    /// The cgroup Docker made for container `id` (full id), whichever cgroup driver and version.
    pub fn of_container(root: &Path, id: &str) -> Option<Self> {
        let v1 = [
            root.join("memory/docker").join(id),
            root.join("memory/system.slice")
                .join(format!("docker-{id}.scope")),
        ];
        let v2 = [
            root.join("docker").join(id),
            root.join("system.slice").join(format!("docker-{id}.scope")),
        ];
        v1.into_iter()
            .find(|d| d.join("memory.max_usage_in_bytes").exists())
            .map(|dir| Self {
                dir,
                version: Version::V1,
            })
            .or_else(|| {
                v2.into_iter()
                    .find(|d| d.join("memory.current").exists())
                    .map(|dir| Self {
                        dir,
                        version: Version::V2,
                    })
            })
    }

    /// Creates a v1 cgroup `name` under `parent` (created too) with a memory limit and no swap.
    pub fn create_v1(parent: &Path, name: &str, limit_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(parent)?;
        let dir = parent.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let cg = Self {
            dir,
            version: Version::V1,
        };
        cg.write("memory.limit_in_bytes", &limit_bytes.to_string())?;
        // memory+swap equal to memory: no swap. The file is missing without swap accounting,
        // and then there is no swap to limit.
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            cg.write("memory.memsw.limit_in_bytes", &limit_bytes.to_string())?;
        }
        Ok(cg)
    }

    /// True when v1 cgroups can be created under `parent` (probes by creating one).
    pub fn v1_writable(parent: &Path) -> bool {
        let n = super::next_id();
        let probe = parent.join(format!("probe-{}-{n}", std::process::id()));
        let ok = fs::create_dir_all(&probe).is_ok()
            && probe.join("memory.max_usage_in_bytes").exists()
            && probe.join("tasks").exists();
        let _ = fs::remove_dir(&probe);
        ok
    }

    /// The v1 `tasks` file: a process joins by writing `0` to it from its only thread (a thread
    /// moving itself, which the kernel does without the cgroup-wide threadgroup lock that a write
    /// to `cgroup.procs` takes: 0.04 ms against 11 to 19 ms here, docs/load.md).
    pub fn tasks_file(&self) -> PathBuf {
        self.dir.join("tasks")
    }

    fn read(&self, file: &str) -> io::Result<String> {
        fs::read_to_string(self.dir.join(file))
    }

    fn write(&self, file: &str, value: &str) -> io::Result<()> {
        fs::write(self.dir.join(file), value)
    }

    fn read_u64(&self, file: &str) -> io::Result<u64> {
        let s = self.read(file)?;
        s.trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{file}: {e}")))
    }

    /// Current charge (v1 `memory.usage_in_bytes`, v2 `memory.current`): anonymous memory and
    /// page cache.
    pub fn usage(&self) -> io::Result<u64> {
        match self.version {
            Version::V1 => self.read_u64("memory.usage_in_bytes"),
            Version::V2 => self.read_u64("memory.current"),
        }
    }

    /// Restarts the peak from the current charge. False when the version cannot (v2).
    pub fn reset_peak(&self) -> io::Result<bool> {
        match self.version {
            Version::V1 => self.write("memory.max_usage_in_bytes", "0").map(|()| true),
            Version::V2 => Ok(false),
        }
    }

    /// Peak charge since the last reset (v1) or since creation (v2).
    pub fn peak(&self) -> io::Result<u64> {
        match self.version {
            Version::V1 => self.read_u64("memory.max_usage_in_bytes"),
            Version::V2 => self.read_u64("memory.peak"),
        }
    }

    /// How many processes the kernel's OOM killer killed in this cgroup so far.
    pub fn oom_kills(&self) -> io::Result<u64> {
        let (file, key) = match self.version {
            // `oom_kill` is in memory.oom_control since Linux 4.13.
            Version::V1 => ("memory.oom_control", "oom_kill"),
            Version::V2 => ("memory.events", "oom_kill"),
        };
        stat_value(&self.read(file)?, key).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in {file}"))
        })
    }

    /// Processes in the cgroup.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        Ok(self
            .read("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Kills whatever is left in the cgroup and removes it. Its remaining page cache goes to the
    /// parent (v1 reparents charges on removal).
    /// Blocks for up to a second while killed processes exit: call it off the async threads.
    pub fn remove(&self) -> io::Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            for pid in self.pids().unwrap_or_default() {
                super::sys::kill_pid(pid);
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                // EBUSY while killed processes are still exiting.
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    }
}

/// The value of `key` in a `key value` per line file (memory.stat, oom_control, memory.events).
pub(crate) fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key))
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_values() {
        let check = |text: &str, key: &str, expect: Option<u64>| {
            assert_eq!(stat_value(text, key), expect, "{key} in {text:?}");
        };
        let oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        check(oom_control, "oom_kill", Some(2));
        check(oom_control, "under_oom", Some(0));
        check(oom_control, "missing", None);
        check("cache 10\nrss 20\ntotal_rss 30\n", "rss", Some(20));
        check("cache 10\nrss 20\ntotal_rss 30\n", "total_rss", Some(30));
        check(
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
            "oom_kill",
            Some(1),
        );
        check("oom_kill x\n", "oom_kill", None);
    }

    fn fake(dir: &Path, files: &[(&str, &str)]) {
        fs::create_dir_all(dir).unwrap();
        for (f, v) in files {
            fs::write(dir.join(f), v).unwrap();
        }
    }

    #[test]
    fn finds_container_cgroups_of_every_layout() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert!(MemoryCgroup::of_container(r, "abc").is_none());

        fake(
            &r.join("memory/docker/abc"),
            &[
                ("memory.max_usage_in_bytes", "5\n"),
                ("memory.usage_in_bytes", "3\n"),
            ],
        );
        let cg = MemoryCgroup::of_container(r, "abc").unwrap();
        assert_eq!(cg.version, Version::V1);
        assert_eq!((cg.peak().unwrap(), cg.usage().unwrap()), (5, 3));
        assert!(cg.reset_peak().unwrap());
        assert_eq!(cg.peak().unwrap(), 0);

        fake(
            &r.join("memory/system.slice/docker-def.scope"),
            &[("memory.max_usage_in_bytes", "1\n")],
        );
        assert_eq!(
            MemoryCgroup::of_container(r, "def").unwrap().dir,
            r.join("memory/system.slice/docker-def.scope")
        );

        fake(
            &r.join("system.slice/docker-v2.scope"),
            &[
                ("memory.current", "7\n"),
                ("memory.peak", "9\n"),
                ("memory.events", "oom 0\noom_kill 3\n"),
            ],
        );
        let cg = MemoryCgroup::of_container(r, "v2").unwrap();
        assert_eq!(cg.version, Version::V2);
        assert_eq!(cg.peak().unwrap(), 9);
        assert_eq!(cg.oom_kills().unwrap(), 3);
        assert!(!cg.reset_peak().unwrap());
    }
}
