#!/usr/bin/env python3
"""A failed job retried with what succeeded reused, and the time that saved (issue 38).

On `ofctl up` (2 agents, process sandbox, SeaweedFS as the store; release binaries in target/release):
the ml-pipeline DAG (pca -> train x6 -> combine) on `sonic-gen ml` data, forced `remote`.
Per repetition: one plain job (its latency), then one job cancelled once `train` runs and
retried (`POST /v1/jobs/{id}/retry`): the retry's latency, what it reused, and the results'
bytes against the plain job's. Prints one JSON line per job and a summary; raw output beside.

Run from the repository root: python3 docs/testing/retry-2026-12-03/measure.py [REPS] [ROWS]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, "python")
import sonic_client as sonic  # noqa: E402

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
BIN = os.path.abspath("target/release")

work = tempfile.mkdtemp(prefix="retry-measure-")
env = dict(os.environ, HOME=work, XDG_CONFIG_HOME=os.path.join(work, "config"), NO_COLOR="1")
up = subprocess.Popen(
    [f"{BIN}/ofctl", "up", "--agents", "2", "--sandbox", "process", "--store", "s3",
     "--no-memory-tier", "--data-dir", os.path.join(work, "data"), "--listen", "127.0.0.1:0",
     "--lambdas", BIN],
    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
)
try:
    config = os.path.join(work, "config", "sonic", "config.json")
    deadline = time.time() + 120
    while not os.path.exists(config):
        assert time.time() < deadline and up.poll() is None, "ofctl up did not start"
        time.sleep(0.2)
    saved = json.load(open(config))
    client = sonic.Client(saved["server"], saved["token"], timeout=120)
    while sum(1 for a in client.agents() if a.get("alive")) < 2:
        assert time.time() < deadline, "the agents did not join"
        time.sleep(0.2)
    data = os.path.join(work, "data.csv")
    subprocess.run([f"{BIN}/sonic-gen", "ml", "--rows", str(ROWS), "--seed", "1", "--out", data],
                   check=True, stdout=subprocess.DEVNULL)
    client.apply("dags/ml-pipeline.yaml")
    print(json.dumps({"machine": os.uname().nodename, "nproc": os.cpu_count(),
                      "loadavg": os.getloadavg(), "rows": ROWS, "reps": REPS}))

    def results(job_id):
        out = {}
        for r in client.get_job(job_id).outputs:
            key = r.split("/result/", 1)[1]
            req = urllib.request.Request(
                f"{client.server}/v1/jobs/{job_id}/results/{key}",
                headers={"Authorization": f"Bearer {saved['token']}"})
            with urllib.request.urlopen(req) as resp:
                out[key] = resp.read()
        return out

    rows = []
    for rep in range(REPS):
        plain = client.run("ml-pipeline", input=data, policy="remote")
        assert plain["status"] == "succeeded", plain
        job = client.submit("ml-pipeline", input=data, policy="remote")
        for ev in client.events(job.id):
            if ev.stage == "train" or ev.ended:
                break
        time.sleep(0.5)
        job.cancel()
        failed = job.wait(timeout=300)
        t0 = time.monotonic()
        retried = client.retry(job.id, wait=True, timeout=600).summary
        wall = time.monotonic() - t0
        same = results(plain["job_id"]) == results(job.id)
        row = {
            "rep": rep,
            "plain_job": plain["job_id"], "plain_latency_s": plain["latency_s"],
            "plain_pca_s": [f["seconds"] for f in plain["functions"] if f["name"] == "pca"][0],
            "cancelled_job": job.id, "cancelled_status": failed.status,
            "cancelled_succeeded": [f.name for f in failed.functions],
            "retry_status": retried.status, "retry_latency_s": retried.latency_s,
            "retry_wall_s": round(wall, 3),
            "reused": [(f.name, f.instance, f.seconds) for f in retried.functions if f.reused],
            "ran": [(f.name, f.instance) for f in retried.functions if not f.reused],
            "results_identical": same,
            "saved_s": round(plain["latency_s"] - retried.latency_s, 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    saved_s = sorted(r["saved_s"] for r in rows)
    print(json.dumps({"summary": {
        "plain_latency_s": sorted(r["plain_latency_s"] for r in rows),
        "retry_latency_s": sorted(r["retry_latency_s"] for r in rows),
        "saved_s": saved_s,
        "all_results_identical": all(r["results_identical"] for r in rows),
        "loadavg_end": os.getloadavg(),
    }}))
finally:
    up.terminate()
    try:
        up.wait(timeout=30)
    except subprocess.TimeoutExpired:
        up.kill()
