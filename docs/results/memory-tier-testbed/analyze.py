#!/usr/bin/env python3
"""The table of docs/results/memory-tier-testbed/README.md from the raw job summaries.

    python3 analyze.py [DIR]      # DIR: the folder run.sh wrote (default: this one)

Writes DIR/jobs.csv (one row per job) and prints the summary (Markdown) on stdout. Standard
library only: Student's t quantile from the regularized incomplete beta function.
"""
import csv
import json
import math
import os
import sys
from collections import Counter, defaultdict


# --- Student's t -------------------------------------------------------------------------------

def _betacf(a, b, x):
    """Continued fraction of the incomplete beta function (Numerical Recipes, betacf)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-15:
            break
    return h


def _ibeta(a, b, x):
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1 - x) / b


def t_cdf(t, df):
    x = df / (df + t * t)
    p = 0.5 * _ibeta(df / 2, 0.5, x)
    return 1 - p if t > 0 else p


def t_quantile(q, df):
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


assert abs(t_quantile(0.975, 7) - 2.364624) < 1e-5
assert abs(t_quantile(0.975, 14) - 2.144787) < 1e-5


def mean_ci(xs):
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return m, sd, h


def welch(a, b):
    """Mean of a - mean of b, its 95% half-width and Welch-Satterthwaite dof."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    df = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return ma - mb, t_quantile(0.975, df) * math.sqrt(se2), df


# --- the jobs ----------------------------------------------------------------------------------

EDGES = ["split->train", "split->stats", "train->join", "stats->join"]


def load(dirname):
    rows = []
    with open(os.path.join(dirname, "jobs.tsv")) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            d = json.load(open(os.path.join(dirname, r["file"])))
            edges = {f"{e['from']}->{e['to']}": e for e in d["edges"]}
            pred = ((d.get("plan") or {}).get("report") or {}).get("predicted") or {}
            plan_edges = {f"{e['from']}->{e['to']}": e for e in
                          ((d.get("plan") or {}).get("report") or {}).get("edges", [])}
            placement = defaultdict(Counter)
            for fn in d["functions"]:
                placement[fn["name"]][f"{fn['agent']}({fn['vm_type']})"] += 1
            place = " ".join(f"{fn}:{'+'.join(f'{a}x{n}' if n > 1 else a for a, n in sorted(c.items()))}"
                             for fn, c in placement.items() for _ in [0])
            row = {
                "seq": int(r["seq"]), "block": r["block"], "config": r["config"], "kind": r["kind"],
                "file": r["file"], "started_utc": r["started_utc"], "loadavg_1m": float(r["loadavg_before"].split()[0]),
                "status": d["status"], "mode": d.get("mode"), "policy": d.get("policy"),
                "latency_s": d["latency_s"], "cost_usd": d["cost_usd"],
                "requests_usd": d["requests_usd"], "storage_usd": d["storage_usd"],
                # What is left: the VMs' time (cost_usd = VMs + requests + storage).
                "vm_usd": d["cost_usd"] - d["requests_usd"] - d["storage_usd"],
                "pred_latency_s": pred.get("latency_s"), "pred_cost_usd": pred.get("cost_usd"),
                "placement": place,
            }
            for e in EDGES:
                row[f"{e} method"] = edges[e]["method"]
                row[f"{e} s"] = edges[e]["seconds"]
                row[f"{e} pred s"] = plan_edges.get(e, {}).get("predicted_s")
            rows.append(row)
    return rows


def main():
    dirname = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = load(dirname)
    with open(os.path.join(dirname, "jobs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    groups = {
        # block "final": the one job run.sh runs after the last off-block, for the checks; not
        # one of the N = 8.
        "planned, tier on": [r for r in rows if r["kind"] == "planned" and r["config"] == "on" and r["block"] != "final"],
        "planned, tier off": [r for r in rows if r["kind"] == "planned" and r["config"] == "off"],
        "forced remote (tier on)": [r for r in rows if r["kind"] == "remote"],
        "forced memory (tier on)": [r for r in rows if r["kind"] == "memory"],
        "warm-up (planned, first after each up), tier on": [r for r in rows if r["kind"] == "warmup" and r["config"] == "on"],
        "warm-up (planned, first after each up), tier off": [r for r in rows if r["kind"] == "warmup" and r["config"] == "off"],
        "first planned job (end of profiling)": [r for r in rows if r["kind"] == "profile" and r["mode"] == "planned"],
        "final check job (planned, tier on)": [r for r in rows if r["block"] == "final"],
    }
    print("## Per configuration (mean ± 95% t half-width, n - 1 dof; sd in brackets)\n")
    print("| configuration | n | failed | latency (s) | cost (µ$) | VMs (µ$) | requests (µ$) | storage (µ$) | predicted latency (s) | predicted cost (µ$) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, g in groups.items():
        ok = [r for r in g if r["status"] == "succeeded"]
        cells = []
        for k, scale, fmt in [("latency_s", 1, "{:.3f} ± {:.3f} ({:.3f})"), ("cost_usd", 1e6, "{:.1f} ± {:.1f} ({:.1f})"),
                              ("vm_usd", 1e6, "{:.1f} ± {:.1f} ({:.1f})"), ("requests_usd", 1e6, "{:.2f} ± {:.2f} ({:.2f})"), ("storage_usd", 1e6, "{:.4f} ± {:.4f} ({:.4f})"),
                              ("pred_latency_s", 1, "{:.3f} ± {:.3f} ({:.3f})"), ("pred_cost_usd", 1e6, "{:.1f} ± {:.1f} ({:.1f})")]:
            xs = [r[k] * scale for r in ok if r[k] is not None]
            if len(xs) >= 2:
                m, sd, h = mean_ci(xs)
                cells.append(fmt.format(m, h, sd))
            elif len(xs) == 1:
                cells.append(fmt.split(" ±")[0].format(xs[0]))
            else:
                cells.append("-")
        print(f"| {name} | {len(ok)} | {len(g) - len(ok)} | " + " | ".join(cells) + " |")

    for title, a_name, b_name, keys in [
        ("Planned, tier on minus tier off", "planned, tier on", "planned, tier off",
         [("latency_s", 1, "s"), ("cost_usd", 1e6, "µ$"), ("vm_usd", 1e6, "µ$"), ("requests_usd", 1e6, "µ$"),
          ("storage_usd", 1e6, "µ$"), ("pred_latency_s", 1, "s, predicted"), ("pred_cost_usd", 1e6, "µ$, predicted")]),
        ("Forced memory minus forced remote (both with the tier)", "forced memory (tier on)", "forced remote (tier on)",
         [("latency_s", 1, "s"), ("cost_usd", 1e6, "µ$"), ("vm_usd", 1e6, "µ$"), ("requests_usd", 1e6, "µ$"),
          ("storage_usd", 1e6, "µ$")]),
    ]:
        a_rows, b_rows = groups[a_name], groups[b_name]
        print(f"\n## {title} (Welch's t, 95%; n = {len(a_rows)}, {len(b_rows)})\n")
        print("| quantity | difference | 95% interval | dof | relative to the second |")
        print("|---|---|---|---|---|")
        for k, scale, unit in keys:
            a = [r[k] * scale for r in a_rows]
            b = [r[k] * scale for r in b_rows]
            d, h, df = welch(a, b)
            mb = sum(b) / len(b)
            rel = (f"{100 * d / mb:+.1f}% [{100 * (d - h) / mb:+.1f}%, {100 * (d + h) / mb:+.1f}%]"
                   if abs(mb) > 1e-12 else "-")
            print(f"| {k} ({unit}) | {d:+.4f} | [{d - h:+.4f}, {d + h:+.4f}] | {df:.1f} | {rel} |")

    print("\n## Edge methods per group (count of jobs)\n")
    for name, g in groups.items():
        c = Counter(tuple(r[f"{e} method"] for e in EDGES) for r in g)
        print(f"- {name}: " + "; ".join(f"{'/'.join(k)} x{n}" for k, n in c.most_common()))
    print(f"  (edges: {', '.join(EDGES)})")

    print("\n## Placements per group (count of jobs)\n")
    for name, g in groups.items():
        c = Counter(r["placement"] for r in g)
        print(f"- {name}: " + "; ".join(f"`{k}` x{n}" for k, n in c.most_common()))

    print("\n## The small edge stats->join, measured and predicted seconds (planned jobs)\n")
    for name in ["planned, tier on", "planned, tier off"]:
        g = groups[name]
        ms = [r["stats->join s"] for r in g]
        ps = [r["stats->join pred s"] for r in g if r["stats->join pred s"] is not None]
        print(f"- {name}: measured {min(ms):.3f} to {max(ms):.3f} s, predicted {min(ps):.3f} to {max(ps):.3f} s")

    print("\n## Predicted against measured, (predicted - measured) / measured, planned jobs\n")
    for name in ["planned, tier on", "planned, tier off", "warm-up (planned, first after each up), tier on",
                 "warm-up (planned, first after each up), tier off"]:
        g = groups[name]
        el = [100 * (r["pred_latency_s"] - r["latency_s"]) / r["latency_s"] for r in g]
        ec = [100 * (r["pred_cost_usd"] - r["cost_usd"]) / r["cost_usd"] for r in g]
        print(f"- {name}: latency {min(el):+.1f}% to {max(el):+.1f}%, cost {min(ec):+.1f}% to {max(ec):+.1f}%")

    print("\n## Load average (1 min) before each job, per group\n")
    for name, g in groups.items():
        ls = [r["loadavg_1m"] for r in g]
        print(f"- {name}: {min(ls):.2f} to {max(ls):.2f}, mean {sum(ls) / len(ls):.2f}")


if __name__ == "__main__":
    main()
