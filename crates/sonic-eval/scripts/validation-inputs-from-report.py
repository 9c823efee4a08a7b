#!/usr/bin/env python3
"""Rebuilds a `validation-inputs.json` for a run made before the bench saved one.

    python3 crates/sonic-eval/scripts/validation-inputs-from-report.py docs/results deploy/catalog.yaml > /tmp/v/validation-inputs.json
    ofctl bench --only validate --out /tmp/v

What such a run kept is not what the bench saves now: it has no profiling samples, so the
parameters are the control plane's *models* at the Fig. 7 input (report.md's model table: the
equations, 3 significant digits; a hot time whose model did not converge with fewer than 5
samples is the cold time, as `DagModels::predict` does), i.e. what `sonic` planned with, not
the measured parameters (the oracle's) a new run saves. Times are divided by the run's dilation
(jobs.csv). Each cell's plan and the planner's bandwidths come from `plans/`, the measured means
from jobs.csv, the VMs from report.md's agent table (one agent per VM). Bad input exits non-zero.
"""
import collections
import csv
import json
import re
import sys

import yaml


def fail(msg):
    sys.exit(f"validation-inputs-from-report: {msg}")


def main():
    if len(sys.argv) != 3:
        fail("usage: validation-inputs-from-report.py RESULTS_DIR CATALOG_YAML")
    results, catalog_path = sys.argv[1:3]
    catalog = yaml.safe_load(open(catalog_path))
    rows = [r for r in csv.DictReader(open(f"{results}/jobs.csv")) if r["experiment"] == "fig7"]
    if not rows:
        fail("jobs.csv has no fig7 job")
    dilations = {float(r["dilation"]) for r in rows}
    if len(dilations) != 1:
        fail(f"fig7 jobs ran at several dilations: {dilations}")
    d = dilations.pop()
    report = open(f"{results}/report.md").read()
    vms = collections.Counter()
    for m in re.finditer(r"^\| (sonic-agent-\S+) \| (\S+) \|", report, re.M):
        vms[m.group(2)] += 1
    if not vms:
        fail("report.md has no agent table")
    models = {}
    for m in re.finditer(
        r"^\| (\S+) \| (\S+) \| (yes|\*\*no\*\*) \| (\d+) \| \d+ \| [^|]* \| ([^|]+) \|$", report, re.M
    ):
        app, param, conv, samples, eq = m.groups()
        models[(app, param)] = (conv == "yes", int(samples), eq.strip())

    def predict(app, param, x):
        conv, samples, eq = models[(app, param)]
        expr = eq.replace("^", "**")
        if not re.fullmatch(r"[0-9eE.+\-*x ]+", expr):
            fail(f"{app} {param}: cannot read the equation {eq!r}")
        return conv, samples, eval(expr, {"__builtins__": {}}, {"x": x})

    cells = collections.defaultdict(list)
    for r in rows:
        cells[(r["app"], r["policy"])].append(r)
    apps = []
    for app in sorted({a for a, _ in cells}):
        x = float(next(r["input_bytes"] for r in rows if r["app"] == app))
        functions, edges = {}, []
        names = sorted({p.split(".")[0] for (a, p) in models if a == app and "->" not in p})
        for f in names:
            _, _, mem = predict(app, f"{f}.memory_mb", x)
            _, _, cold = predict(app, f"{f}.cold_s", x)
            hconv, hn, hot = predict(app, f"{f}.hot_s", x)
            hot = hot if hconv else (min(hot, cold) if hn >= 5 else cold)
            _, _, inst = predict(app, f"{f}.instances", x)
            _, _, over = predict(app, f"{f}.overhead_s", x)
            functions[f] = {
                "memory_mb": max(mem, 1.0),
                "cold_s": max(cold, 0.0) / d,
                "hot_s": max(hot, 0.0) / d,
                "instances": max(1, round(inst)),
                "overhead_s": max(over, 0.0) / d,
            }
        for (a, p) in models:
            if a == app and "->" in p:
                src, dst = p[: -len(".bytes")].split("->")
                edges.append({"from": src, "to": dst, "bytes": max(0, round(predict(app, p, x)[2]))})
        out_cells = []
        for (a, policy), jobs in sorted(cells.items()):
            if a != app:
                continue
            try:
                plan = json.load(open(f"{results}/plans/fig7-{app}-{policy}.json"))
            except FileNotFoundError:
                plan = None
            net = {}
            for t, v in (plan or {}).get("network_mbps", {}).items():
                if v.get("source") == "measured":
                    net[t] = v["network_mbps"] * d
            out_cells.append({
                "policy": policy,
                "jobs": len(jobs),
                "real_latency_s": sum(float(j["latency_s"]) for j in jobs) / len(jobs),
                "real_cost_usd": sum(float(j["cost_usd"]) for j in jobs) / len(jobs),
                "plan": plan and {"stages": plan["stages"], "edges": plan["edges"]},
                "network_mbps": net,
            })
        apps.append({"app": app, "input_bytes": int(x),
                     "params": {"functions": functions, "edges": sorted(edges, key=lambda e: (e["from"], e["to"]))},
                     "cells": out_cells})
    json.dump({"dilation": d, "catalog": catalog, "vms": dict(vms), "apps": apps}, sys.stdout, indent=1)


main()
