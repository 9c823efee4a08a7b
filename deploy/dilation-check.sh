#!/usr/bin/env bash
# Does the time-dilated cluster hold (docs/evaluation.md, "The dilated cluster")? The same
# experiment on a cluster of containers dilated at each factor in turn, in emulated time (every
# measured time divided by the factor): mapreduce-sort at 32 MB, forced `remote` then `direct`
# (spread over the agents as profiling places them), REPS rounds. It holds when, per policy, the
# mean latency and the mean cost at every factor are within TOL of the first factor's.
#
#   bash deploy/dilation-check.sh [--factors 4,8] [--reps 5] [--vms m5.large:2] [--tol 0.10]
#                                 [--out DIR] [--release] [--no-build] [--keep]
#
#   --factors   the dilation factors, compared with the first (default 4,8: on 2 cores, D = 4 is
#               the least that leaves a core to the store and the control plane, which are not
#               dilated; cluster.sh warns of a D that leaves less)
#   --vms       the cluster, one agent per VM (default m5.large:2: 4 vCPUs)
#   --out       where each factor's jobs.csv goes (DIR/D=<factor>/jobs.csv, its jobs' summaries in
#               DIR/D=<factor>/summaries/), the comparison (DIR/dilation.csv) and where the real
#               time goes per factor (DIR/breakdown.csv, deploy/dilation-breakdown.py);
#               default .ci-data/dilation-check
#   --release   daemons, lambdas and ofctl from target/release (default target/debug)
#   --no-build  use the binaries and images already built
#   --keep      leave the last cluster up (default: `cluster.sh down` at the end, whatever happened)
#
# Exit 0 when it holds, 1 when a figure is off by more than TOL (the table says which), 2 on bad
# usage. Starts and removes its own cluster: a cluster already up is replaced.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
factors=4,8
reps=5
vms=m5.large:2
tol=0.10
out="$ROOT/.ci-data/dilation-check"
profile=debug
build=1
keep=0

log() { echo "dilation-check: $*" >&2; }
usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --factors | --reps | --vms | --tol | --out)
            [ "$#" -ge 2 ] || { log "$1 needs a value"; exit 2; } ;;
    esac
    case "$1" in
        --factors) factors="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --vms) vms="$2"; shift 2 ;;
        --tol) tol="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --release) profile=release; shift ;;
        --no-build) build=0; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) usage 0 ;;
        *) log "unknown argument $1"; usage 2 ;;
    esac
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { log "--reps takes a positive number"; exit 2; }
[[ "$factors" =~ ^[0-9.]+(,[0-9.]+)+$ ]] || { log "--factors takes two or more numbers, e.g. 2,4"; exit 2; }
python3 -c 'import sys; t=float(sys.argv[1]); sys.exit(0 if 0 < t < 1 else 1)' "$tol" 2>/dev/null ||
    { log "--tol takes a fraction in (0, 1), e.g. 0.10"; exit 2; }
IFS=, read -r -a FACTORS <<<"$factors"
# Every factor must be one cluster.sh accepts for these VMs (it says why not).
for d in "${FACTORS[@]}"; do
    bash "$ROOT/deploy/cluster.sh" up --dry-run --vms "$vms" --dilation "$d" >/dev/null
done
mkdir -p "$out"
out="$(cd "$out" && pwd -P)"

profile_flag=()
[ "$profile" = release ] && profile_flag=(--release)
if [ "$build" = 1 ]; then
    log "building ofctl (cargo build ${profile_flag[*]} -p ofctl)"
    (cd "$ROOT" && cargo build -q "${profile_flag[@]}" -p ofctl)
fi
OFCTL="$ROOT/target/$profile/ofctl"
[ -x "$OFCTL" ] || { log "no $OFCTL: build it (cargo build ${profile_flag[*]} -p ofctl)"; exit 1; }

# The clusters' ofctl context, apart from the user's own.
export XDG_CONFIG_HOME="$out/config"
mkdir -p "$XDG_CONFIG_HOME"
unset SONIC_SERVER SONIC_TOKEN

finish() {
    if [ "$keep" = 0 ]; then bash "$ROOT/deploy/cluster.sh" down >/dev/null 2>&1 || true; fi
}
trap finish EXIT

first_build=("$build")
for d in "${FACTORS[@]}"; do
    log "D=$d: cluster.sh up --vms $vms --dilation $d"
    bash "$ROOT/deploy/cluster.sh" down >/dev/null
    up_flags=(--vms "$vms" --dilation "$d" "${profile_flag[@]}")
    # The images are built once, with the first cluster.
    [ "${first_build[0]}" = 1 ] || up_flags+=(--no-build)
    first_build=(0)
    bash "$ROOT/deploy/cluster.sh" up "${up_flags[@]}" >/dev/null
    bash "$ROOT/deploy/cluster.sh" status >&2
    mkdir -p "$out/D=$d"
    "$OFCTL" bench --cluster containers --dilation "$d" --only dilation \
        --dilation-reps "$reps" --out "$out/D=$d" >&2
    # Every job's summary as the cluster measured it (real time), for the breakdown below.
    mkdir -p "$out/D=$d/summaries"
    python3 -c 'import csv, sys; [print(r["job_id"]) for r in csv.DictReader(open(sys.argv[1]))]' \
        "$out/D=$d/jobs.csv" | while read -r id; do
        "$OFCTL" -o json describe job "$id" >"$out/D=$d/summaries/$id.json" ||
            log "no summary of job $id"
    done
done

# Where the time goes, per factor (real time): which parts dilate and which do not.
python3 "$ROOT/deploy/dilation-breakdown.py" "$out" "${FACTORS[@]}" >&2 ||
    log "no breakdown (deploy/dilation-breakdown.py failed)"

python3 - "$out" "$tol" "${FACTORS[@]}" <<'PY'
import csv, statistics, sys
out, tol, factors = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
cells = {}
for d in factors:
    with open(f"{out}/D={d}/jobs.csv") as f:
        for r in csv.DictReader(f):
            cells.setdefault((r["policy"], d), []).append(r)
policies = sorted({p for p, _ in cells}, key=lambda p: ["remote", "direct"].index(p) if p in ("remote", "direct") else 9)
lines = ["policy,dilation,jobs,latency_s,latency_sd,cost_usd,edge_s,latency_vs_first,cost_vs_first"]
table = [["POLICY", "D", "JOBS", "LATENCY S (SD)", "COST USD", "LONGEST EDGE S", "LATENCY / D0", "COST / D0"]]
ok = True
for p in policies:
    base = None
    for d in factors:
        rs = cells.get((p, d), [])
        if not rs:
            print(f"dilation-check: no {p} job at D={d}", file=sys.stderr)
            ok = False
            continue
        lat = [float(r["latency_s"]) for r in rs]
        cost = [float(r["cost_usd"]) for r in rs]
        edge = [float(r["edge_s"]) for r in rs]
        m = (statistics.mean(lat), statistics.mean(cost), statistics.mean(edge))
        sd = statistics.stdev(lat) if len(lat) > 1 else 0.0
        if base is None:
            base = m
        rl, rc = m[0] / base[0], m[1] / base[1]
        if abs(rl - 1) > tol or abs(rc - 1) > tol:
            ok = False
        lines.append(f"{p},{d},{len(rs)},{m[0]:.4f},{sd:.4f},{m[1]:.8f},{m[2]:.4f},{rl:.4f},{rc:.4f}")
        table.append([p, d, str(len(rs)), f"{m[0]:.3f} ({sd:.3f})", f"{m[1]:.7f}", f"{m[2]:.3f}",
                      f"{rl:.3f}", f"{rc:.3f}"])
open(f"{out}/dilation.csv", "w").write("\n".join(lines) + "\n")
w = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
for r in table:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
verdict = "holds" if ok else "does NOT hold"
print(f"dilation {verdict}: emulated mean latency and cost within {tol:.0%} of D={factors[0]}'s "
      f"for every policy ({out}/dilation.csv)")
sys.exit(0 if ok else 1)
PY
