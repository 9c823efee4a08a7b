#!/usr/bin/env bash
# What the testbed's store sustains, measured through an agent's shaped link, written into a
# catalog the testbed then plans with (issue: a testbed that is not the model).
#
#   bash deploy/measure-store.sh [--agent NAME] [--out FILE] [--catalog FILE] [PROBE FLAGS...]
#
# Needs a cluster from `deploy/cluster.sh up` (plain or --dilation D). Runs sonic-store-probe
# inside the agent container NAME (default: the agent whose VM type has the fastest network, so
# its link bounds the store's throughput least), against the cluster's store as the agent reaches
# it (SeaweedFS as it is, behind the agent's delay line when it has one): request latency (small PUTs and GETs, medians), one VM's write and read throughput (8 MB
# objects), requests per second (1000 small PUTs, 128 at once). The figures are taken in the
# cluster's time; on a dilated cluster they are turned into the emulated VM's time (latency / D,
# throughputs and request rate x D), the units of the catalog, which the control plane dilates
# again.
#
# Writes FILE (default .ci-data/cluster/catalog-measured.yaml): --catalog (default the cluster's
# own) with remote_storage's request_latency_ms, write_mbps, read_mbps and requests_per_s
# replaced by the measured ones (requests_per_s only when the store, not the probe's own
# concurrency at that latency, bounded the rate), and FILE.json beside it: the probe's raw output, the agent, its
# link, D and the figures written. `deploy/cluster.sh up --plan-catalog FILE` (same flags
# otherwise, the testbed's --catalog unchanged) then plans with them. Prints FILE's path as its last line.
#
# Where the measured write or read rate is the link's own cap (within 10%), the store kept up with
# the link and the catalog's figure was what bounded it; below that, the store is slower than the
# catalog says, and the measured figure is the truth the planner gets.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.ci-data/cluster"
OUT="$STATE/catalog-measured.yaml"
AGENT=""
CATALOG=""
PROBE=()

die() { echo "measure-store: $*" >&2; exit 1; }
log() { echo "measure-store: $*" >&2; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --agent) AGENT="${2:?--agent NAME}"; shift 2 ;;
        --out) OUT="${2:?--out FILE}"; shift 2 ;;
        --catalog) CATALOG="${2:?--catalog FILE}"; shift 2 ;;
        -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) PROBE+=("$1"); shift ;;
    esac
done

command -v docker >/dev/null || die "docker is not installed"
[ -f "$STATE/cluster.json" ] || die "no cluster: run bash deploy/cluster.sh up first"
if [ -z "$CATALOG" ]; then
    CATALOG="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["catalog"])' "$STATE/cluster.json")"
fi
[ -f "$CATALOG" ] || die "no catalog $CATALOG"
DILATION="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("dilation") or 1)' "$STATE/cluster.json")"

if [ -z "$AGENT" ]; then
    AGENT="$(docker ps --filter 'name=^/sonic-agent-[0-9]+$' --format '{{.Names}}' |
        while read -r n; do
            echo "$(docker inspect -f '{{index .Config.Labels "sonic.network_mbps"}}' "$n") $n"
        done | sort -k1,1gr -k2,2V | head -n 1 | cut -d' ' -f2)"
    [ -n "$AGENT" ] || die "no agent container runs: bash deploy/cluster.sh up"
fi
[ "$(docker inspect -f '{{.State.Running}}' "$AGENT" 2>/dev/null)" = true ] || die "$AGENT does not run"
link_env="$(docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$AGENT" | grep '^SONIC_LINK_' || true)"
[ -n "$link_env" ] || die "$AGENT has no shaped link (SONIC_LINK_*): bring the cluster up again with this version of deploy/cluster.sh"
vm_type="$(docker inspect -f '{{index .Config.Labels "sonic.vm_type"}}' "$AGENT")"

log "probing the store from $AGENT ($vm_type; D = $DILATION): a minute or so"
raw="$(docker exec -e SONIC_S3_ENDPOINT=http://sonic-store:8333 -e SONIC_S3_BUCKET=sonic \
    -e SONIC_S3_ACCESS_KEY=sonic -e SONIC_S3_SECRET_KEY=sonicsecret \
    "$AGENT" sonic-store-probe "${PROBE[@]}")" || die "sonic-store-probe failed in $AGENT"

mkdir -p "$(dirname "$OUT")"
python3 - "$CATALOG" "$OUT" "$DILATION" "$AGENT" "$vm_type" "$raw" "$link_env" <<'PY'
import json, re, sys, datetime
catalog, out, d, agent, vm_type, raw, link_env = sys.argv[1:]
d = float(d)
m = json.loads(raw)
link = dict(l.split("=", 1) for l in link_env.split() if "=" in l)

def cap(key):
    vm = float(link["SONIC_LINK_MBPS"])
    v = link.get(key)
    return min(vm, float(v)) if v else vm

write_cap, read_cap = cap("SONIC_LINK_STORE_WRITE_MBPS"), cap("SONIC_LINK_STORE_READ_MBPS")
figures = {
    "request_latency_ms": round(m["request_latency_ms"] / d, 3),
    "write_mbps": round(m["write_mbps"] * d, 1),
    "read_mbps": round(m["read_mbps"] * d, 1),
}
notes = []
rps = round(m["requests_per_s"] * d, 1)
if m.get("rate_bound_by_concurrency"):
    # Little's law: the probe's own concurrency at this latency was the bound, not the store.
    notes.append(f"requests: {rps:g}/s (emulated) with {m['samples']['rate_concurrency']} in flight "
                 "is what the latency allows that many: the store sustains at least that; the "
                 "catalog's requests_per_s is kept (raise --rate-concurrency to find the store's)")
else:
    figures["requests_per_s"] = rps
    notes.append(f"requests: {rps:g}/s (emulated), below what the probe's concurrency allows: the store's own")
for what, got, c in (("write", m["write_mbps"], write_cap), ("read", m["read_mbps"], read_cap)):
    if got >= 0.9 * c:
        notes.append(f"{what}: {got:.1f} Mbit/s measured, the link's cap {c:g}: the store kept up")
    else:
        notes.append(f"{what}: {got:.1f} Mbit/s measured below the link's cap {c:g}: the store bounds it")

text = open(catalog).read().splitlines()
try:
    start = next(i for i, l in enumerate(text) if re.match(r"^remote_storage:\s*$", l))
except StopIteration:
    print(f"measure-store: {catalog}: no block-style remote_storage: mapping to update", file=sys.stderr)
    sys.exit(1)
end = start + 1
while end < len(text) and (text[end].startswith(" ") or not text[end].strip()):
    end += 1
block = text[start + 1:end]
for key, value in figures.items():
    for i, l in enumerate(block):
        if re.match(rf"^\s+{key}:", l):
            block[i] = f"  {key}: {value}"
            break
    else:
        block.append(f"  {key}: {value}")
stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
header = [
    f"# Measured by deploy/measure-store.sh on {stamp}: the store as {agent} ({vm_type}) sees it",
    f"# through its kernel-shaped link, D = {d:g}, in the emulated VM's time; raw: {out}.json.",
    *[f"# {n}" for n in notes],
]
text = text[:start] + header + ["remote_storage:"] + block + text[end:]
open(out, "w").write("\n".join(text) + "\n")
json.dump({"catalog": catalog, "agent": agent, "vm_type": vm_type, "dilation": d, "link": link,
           "measured": m, "written": figures, "notes": notes}, open(out + ".json", "w"), indent=2)
for n in notes:
    print(f"measure-store: {n}", file=sys.stderr)
print(f"measure-store: written {figures}", file=sys.stderr)
PY
echo "$OUT"
