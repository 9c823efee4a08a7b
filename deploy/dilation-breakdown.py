#!/usr/bin/env python3
"""Where a dilated cluster's job time goes, per factor (deploy/dilation-check.sh runs it).

    python3 deploy/dilation-breakdown.py OUT D1 D2 ...

Reads OUT/D=<d>/summaries/*.json (job summaries, `ofctl -o json describe job ID`, as measured by
the cluster: real time, not divided by D) and writes OUT/breakdown.csv: per policy and factor, the
mean real seconds of each part of a job, and prints them with, for each part, the ratio of its
real time at the last factor to the first. A part that dilates grows with D (ratio = D_last /
D_first); a part that does not keeps its real time (ratio 1) and so shrinks in emulated time.

Parts of a job (stages in the order they started; times from the summary's started_s/ended_s):
  before    job start to its first instance's dispatch (queueing, planning, staging the input)
  exec      per stage, the longest instance's lambda time (`seconds`), summed over the stages
  run       per stage, its span (first dispatch to last report) less that longest lambda time:
            fetching inputs, starting, uploading outputs, the run request and report, imbalance
  between   from one stage's last report to the next stage's first dispatch, summed (the
            control plane between stages, and the next stage's fetches: `fetch`)
  fetch     the stages' fetches (the summary's `fetches`: a receiving agent bringing a stage's
            inputs before its first batch), their union
  after     the last report to the job's end (the control plane finishing the job)
  latency   the whole (= before + exec + run + between + after, stages not overlapping)
  control   the time no instance of the job was out on an agent (sent, not yet reported) and no
            stage fetch was under way: the control plane's own work, which the bench counts
            undivided (ofctl's bench::harness::control_plane_s)
  agents    latency - control: the agents' part, which the bench divides by D
"""
import csv
import glob
import json
import os
import statistics
import sys

EMUL = ["emul_all_divided", "emul"]
PARTS = ["latency", "control", "agents", "before", "exec", "run", "between", "fetch", "after", "edge_max"]


def parts(s):
    stages = {}
    for f in s.get("functions", []):
        if f.get("started_s") is None or f.get("ended_s") is None:
            return None
        st = stages.setdefault(f["name"], {"start": f["started_s"], "end": f["ended_s"], "exec": 0.0})
        st["start"] = min(st["start"], f["started_s"])
        st["end"] = max(st["end"], f["ended_s"])
        st["exec"] = max(st["exec"], f["seconds"])
    if not stages:
        return None
    order = sorted(stages.values(), key=lambda x: x["start"])
    # The union of the instances' [started_s, ended_s] and the stages' fetches: the rest of the
    # latency is the control's.
    def union(iv):
        merged = []
        for a, b in sorted(iv):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return sum(min(b, s["latency_s"]) - max(a, 0.0) for a, b in merged if b > a)

    fetches = [(f["started_s"], f["ended_s"]) for f in s.get("fetches", [])]
    covered = union([(f["started_s"], f["ended_s"]) for f in s["functions"]] + fetches)
    control = min(s["latency_s"], max(0.0, s["latency_s"] - covered))
    between = sum(max(0.0, b["start"] - a["end"]) for a, b in zip(order, order[1:]))
    return {
        "latency": s["latency_s"],
        "control": control,
        "agents": s["latency_s"] - control,
        "before": order[0]["start"],
        "exec": sum(x["exec"] for x in order),
        "run": sum(x["end"] - x["start"] - x["exec"] for x in order),
        "between": between,
        "fetch": union(fetches),
        "after": s["latency_s"] - max(x["end"] for x in order),
        "edge_max": max((e["seconds"] for e in s.get("edges", [])), default=0.0),
    }


def main():
    out, factors = sys.argv[1], sys.argv[2:]
    cells = {}
    for d in factors:
        for path in sorted(glob.glob(os.path.join(out, f"D={d}", "summaries", "*.json"))):
            with open(path) as f:
                s = json.load(f)
            p = parts(s)
            if p is not None and s.get("status") == "succeeded":
                cells.setdefault((s["policy"], d), []).append(p)
    rows = []
    for (policy, d), ps in sorted(cells.items(), key=lambda kv: (kv[0][0], float(kv[0][1]))):
        m = {k: statistics.mean(p[k] for p in ps) for k in PARTS}
        # Emulated latency both ways: all of it divided by D, and the control plane's part
        # undivided (what the bench reports).
        m["emul_all_divided"] = m["latency"] / float(d)
        m["emul"] = m["control"] + m["agents"] / float(d)
        rows.append([policy, d, len(ps)] + [m[k] for k in PARTS + EMUL])
    with open(os.path.join(out, "breakdown.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "dilation", "jobs"] + [f"{k}_real_s" for k in PARTS]
                   + ["emulated_all_divided_s", "emulated_s"])
        for r in rows:
            w.writerow(r[:3] + [f"{x:.4f}" for x in r[3:]])
    print("real seconds per job (mean), as the cluster measured them:")
    print("  ".join(["POLICY", "D", "JOBS"] + [k.upper() for k in PARTS]
                    + ["LATENCY/D", "CONTROL+AGENTS/D"]))
    for r in rows:
        print("  ".join([r[0], r[1], str(r[2])] + [f"{x:.3f}" for x in r[3:]]))
    lo, hi = factors[0], factors[-1]
    for policy in sorted({p for p, _ in cells}):
        a = [r for r in rows if r[0] == policy and r[1] == lo]
        b = [r for r in rows if r[0] == policy and r[1] == hi]
        if a and b:
            ratios = [f"{k}={y / x:.2f}" if x > 1e-6 else f"{k}=-"
                      for k, x, y in zip(PARTS + EMUL, a[0][3:], b[0][3:])]
            print(f"{policy}: real time at D={hi} / at D={lo} (dilates: {float(hi) / float(lo):.2f}; "
                  f"does not: 1.00; the emulated ones should be 1.00): " + " ".join(ratios))


if __name__ == "__main__":
    main()
