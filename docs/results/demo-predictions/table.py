#!/usr/bin/env python3
"""Prediction against measure of every planned job in `ofctl demo -o json` outputs.

usage: python3 table.py run1.json run2.json ...  (prints a Markdown table)
"""
import json
import sys

print("| run | DAG | policy | input | latency predicted / measured (s) | error | cost predicted / measured ($) | error |")
print("|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    d = json.load(open(path))
    for dag in d["dags"]:
        for j in dag["planned_jobs"] + dag.get("baseline_jobs", []):
            p = j["plan"]
            r = p["report"]
            pr = r["predicted"] if p["used"] == "best" else r["second_best"]["predicted"]
            el = (pr["latency_s"] - j["latency_s"]) / j["latency_s"] * 100
            ec = (pr["cost_usd"] - j["cost_usd"]) / j["cost_usd"] * 100
            print(
                f"| {path.rsplit('/', 1)[-1]} | {dag['dag']} | {j['policy']} | {j['input_bytes'] / 1e6:.0f} MB "
                f"| {pr['latency_s']:.3f} / {j['latency_s']:.3f} | {el:+.0f}% "
                f"| {pr['cost_usd']:.7f} / {j['cost_usd']:.7f} | {ec:+.0f}% |"
            )
