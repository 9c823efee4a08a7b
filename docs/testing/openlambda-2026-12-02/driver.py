"""By-hand run of OpenLambda's own scripts/test.py (its repository at a288ce1e, unpacked at
$OL_REPO, default /tmp/ol) against Sonic, with only what starts OpenLambda's `ol` binary
replaced:

- the worker: `SonicWorker` starts `ofctl up ... --openlambda 127.0.0.1:5000
  --openlambda-config <ol_dir>/config.json` (the config.json test.py's TestConfContext writes)
  and stops it with Ctrl-C, where OpenLambda's harness runs `ol worker up` / `ol worker down`;
- `install_examples_to_worker_registry`: uploads each of `examples/` with POST /registry/<name>,
  as `ol admin install` does, to a Sonic started for it.

test.py's `run_tests()` then runs unchanged, in its order. With a third argument, another of
its scripts runs instead (`package_tests`: the examples are installed first, as its CI does).

    python3 driver.py process|docker [test_filter,...|-] [script]
"""
import io, json, os, signal, subprocess, sys, tarfile, tempfile, time

import requests

OL = os.environ.get("OL_REPO", "/tmp/ol")
OFCTL = os.path.abspath(os.environ.get("OFCTL", "target/debug/ofctl"))
SONIC_DIR = os.getcwd()
SANDBOX = sys.argv[1] if len(sys.argv) > 1 else "process"
sys.path.insert(0, os.path.join(OL, "scripts"))
sys.path.insert(0, os.path.join(OL, "python/src"))
os.chdir(OL)  # test.py reads examples/ and python/src from its repository's root

import helper
import helper.test as ht
import importlib
SCRIPT = sys.argv[3] if len(sys.argv) > 3 else "test"
t = importlib.import_module(SCRIPT)

ol_dir = tempfile.mkdtemp(prefix="ol-dir-")
data_dir = tempfile.mkdtemp(prefix="sonic-data-")
registry = os.path.join(ol_dir, "registry")
os.makedirs(registry)
# OpenLambda's default worker configuration (its GetDefaultWorkerConfig) as far as test.py's
# TestConfContext changes it: every key it sets must exist.
conf = {
    "worker_dir": os.path.join(ol_dir, "worker"),
    "server_mode": "lambda",
    "worker_url": "localhost",
    "worker_port": "5000",
    "registry": "file://" + registry,
    "sandbox": "sock",
    "log_output": True,
    "registry_cache_ms": 5000,
    "mem_pool_mb": 1500,
    "limits": {"procs": 10, "mem_mb": 50, "cpu_percent": 100, "swappiness": 0, "runtime_sec": 30},
    "installer_limits": {"mem_mb": 250, "runtime_sec": 300},
    "features": {"reuse_cgroups": False, "import_cache": "tree", "downsize_paused_mem": True,
                 "enable_seccomp": True},
    "trace": {"cgroups": False, "memory": False, "evictor": False, "package": False,
              "latency": False},
    "docker": {"base_image": "ol-min"},
    "storage": {"root": "private", "scratch": "", "code": ""},
}
helper.setup_config(ol_dir)
helper.put_conf(conf)
open(os.path.join(ol_dir, "worker.out"), "w").close()
t.OL_DIR = ol_dir


class SonicWorker:
    """Sonic in place of `ol worker up`: started with the current config.json, stopped with
    Ctrl-C."""

    def __init__(self):
        log = open(os.path.join(ol_dir, "worker.out"), "a")
        self.proc = subprocess.Popen(
            [OFCTL, "up", "--agents", "1", "--sandbox", SANDBOX, "--store", "local",
             "--listen", "127.0.0.1:0", "--data-dir", data_dir,
             "--openlambda", "127.0.0.1:5000",
             "--openlambda-config", os.path.join(ol_dir, "config.json")],
            stdout=log, stderr=subprocess.STDOUT, cwd=SONIC_DIR,
            start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get("http://127.0.0.1:5000/status", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"ofctl up exited with {self.proc.returncode}")
            time.sleep(0.2)
        raise RuntimeError("Sonic's OpenLambda listener did not answer within 120 s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=120)


def install_examples():
    """`ol admin install` of each example: a .tar.gz of its folder, POSTed to the worker
    run_tests() started for it."""
    ex = os.path.join(OL, "examples")
    for name in sorted(os.listdir(ex)):
        d = os.path.join(ex, name)
        if not os.path.isdir(d):
            continue
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for f in sorted(os.listdir(d)):
                tar.add(os.path.join(d, f), arcname=f)
        r = requests.post(f"http://127.0.0.1:5000/registry/{name}", data=buf.getvalue(),
                          timeout=900)
        print(f"install {name}: {r.status_code} {r.text.strip()[:150]}", flush=True)


t.install_examples_to_worker_registry = install_examples
ht.set_worker_type(SonicWorker)
# The harness counts host mounts before and after each test (SOCK's leaks). With Docker
# workers each warm worker container adds mounts while it runs.
if SANDBOX == "docker":
    ht.mounts = lambda: set()
if len(sys.argv) > 2 and sys.argv[2] != "-":
    ht.set_test_filter(sys.argv[2].split(","))
ht.start_tests()
if SCRIPT != "test":
    w = SonicWorker()
    try:
        install_examples()
    finally:
        w.stop()
t.run_tests()
ht.check_test_results()
