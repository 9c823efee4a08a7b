"""By-hand run of OpenLambda's scripts/test.py cases against Sonic at 127.0.0.1:5000: the
examples uploaded with POST /registry/<name> (Sonic's install), test.py's functions called in
run_tests() order, the worker start/stop replaced by nothing (Sonic is already up)."""
import io, os, sys, tarfile, tempfile, requests
sys.path.insert(0, "/tmp/ol/scripts"); sys.path.insert(0, "/tmp/ol/python/src")
import helper, helper.test as ht
olx = tempfile.mkdtemp()
open(os.path.join(olx, "worker.out"), "w").close()
import json
open(os.path.join(olx, "config.json"), "w").write(json.dumps({"registry": olx, "registry_cache_ms": 3000, "limits": {"procs": 10, "mem_mb": 50}, "features": {"import_cache": "tree"}, "mem_pool_mb": 0, "trace": {}}))
helper._OL_DIR = olx
helper._CURR_CONF = {"limits": {"procs": 10, "mem_mb": 50}, "registry": olx, "registry_cache_ms": 3000}
class SonicWorker:
    def stop(self): pass
ht.set_worker_type(SonicWorker)
# The harness counts host mounts before and after each test (SOCK's leaks). With Docker workers,
# Sonic's warm worker containers stay up between tests (OpenLambda's harness restarts its worker
# instead), and each adds mounts: the check is left out of this run.
if os.environ.get("IGNORE_MOUNTS"):
    ht.mounts = lambda: set()
import test as t
t.OL_DIR = olx
ex = "/tmp/ol/examples"
for name in sorted(os.listdir(ex)):
    d = os.path.join(ex, name)
    if not os.path.isdir(d): continue
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in os.listdir(d):
            tar.add(os.path.join(d, f), arcname=f)
    r = requests.post(f"http://127.0.0.1:5000/registry/{name}", data=buf.getvalue(), timeout=600)
    print(f"install {name}: {r.status_code} {r.text.strip()[:150]}")
ht.start_tests()
only = sys.argv[1].split(",") if len(sys.argv) > 1 else None
cases = [("ping_test", {}), ("install_tests", {}), ("fork_bomb", {}), ("max_mem_alloc", {}),
         ("numpy_test", {}), ("flask_test", {}), ("wsgi_post_echo_test", {}),
         ("flask_entry_test", {}), ("wsgi_entry_test", {}), ("test_http_method_restrictions", {}),
         ("fastapi_test", {}), ("env_test", {}), ("update_code", {}),
         ("stress_one_lambda", {"procs": 1, "seconds": 5}), ("stress_one_lambda", {"procs": 2, "seconds": 5}),
         ("stress_one_lambda", {"procs": 8, "seconds": 5}),
         ("call_each_once", {"lambda_count": 10, "alloc_mb": 1})]
for name, kw in cases:
    if only and name not in only: continue
    getattr(t, name)(**kw)
ht.check_test_results()
