#!/usr/bin/env python3
"""Prints the right-sizing run's table from jobs.jsonl and models.json (run from this folder)."""
import json, statistics
rows = []
print("| job | mode | input MB | train CPUs (given) | train s | pca CPUs / s | planned train cores | predicted s | measured s | error |")
print("|---|---|---|---|---|---|---|---|---|---|")
errs = []
for n, l in enumerate(open('jobs.jsonl'), 1):
    j = json.loads(l)
    fs = {f['name']: f for f in j['functions']}
    plan = (j.get('plan') or {}).get('report') or {}
    pst = {s['function']: s for s in plan.get('stages', [])}
    pred = plan.get('predicted', {}).get('latency_s')
    err = (pred - j['latency_s']) / j['latency_s'] if pred else None
    if err is not None:
        errs.append(err)
    t, p = fs['train'], fs['pca']
    print(f"| {n} | {j['mode']} | {j['input_bytes']/1e6:.2f} | {t.get('cpus')} | {t['seconds']:.2f} ({'cold' if t['cold'] else 'hot'}) "
          f"| {p.get('cpus')} / {p['seconds']:.2f} | {pst.get('train', {}).get('cores', '-')} | "
          f"{'%.2f' % pred if pred else '-'} | {j['latency_s']:.2f} | {'%+.0f%%' % (100 * err) if err is not None else '-'} |")
m = json.load(open('models.json'))
print()
for x in m['models']:
    if x['parameter'].endswith('.parallel'):
        print(f"- `{x['parameter']}` = {x['equation']} ({x['samples']} runs, told apart: {x['converged']})")
if errs:
    print(f"- planned jobs: {len(errs)}, median absolute latency error {100*statistics.median(abs(e) for e in errs):.0f}%")
