#!/usr/bin/env bash
# The memory tier on the container testbed (issue 37, memory half): memory-mix2 (small and large
# intermediates) on `deploy/cluster.sh up --agents 4` (plain, scale 0.125), profiled until planned,
# then planned jobs with the tier and without it, interleaved in blocks, and the forced `remote`
# and `memory` baselines with the tier. Writes every job's JSON and the cluster's own output into
# OUT; analyze.py makes the table.
#
#   REPO=/path/to/a/checkout OUT=docs/results/memory-tier-testbed bash run.sh
#
# REPO: the tree whose deploy/cluster.sh and target/debug binaries are used (default: this
# repository). The committed run used a `git archive` of one commit with its own target/ (README),
# so that other sessions building in the working tree could not change the binaries mid-run.
# Blocks: on-1 off-1 on-2 off-2 ... (ROUNDS rounds); every block starts right after an `up` that
# recreated the control plane and the agents, with one warm-up planned job that is kept but not
# counted. An on-block: warm-up, PER planned jobs, then PER forced `remote` and PER forced
# `memory` alternating; an off-block: warm-up, PER planned jobs.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="${REPO:-$(cd "$HERE/../../.." && pwd)}"
OUT="${OUT:-$HERE}"
ROUNDS="${ROUNDS:-4}"
PER="${PER:-2}"
MAX_PROFILE="${MAX_PROFILE:-12}"
DAG_FILE="${DAG_FILE:-$OUT/memory-mix2.yaml}"
OFCTL="$REPO/target/debug/ofctl"
CLUSTER=(bash "$REPO/deploy/cluster.sh")
# A private ofctl context: `up` saves one, and must not overwrite the user's.
export XDG_CONFIG_HOME="${XDG_CONFIG_HOME_RUN:-$(mktemp -d /tmp/mt-xdg.XXXXXX)}"
mkdir -p "$OUT/jobs" "$OUT/cluster"
JOBS_TSV="$OUT/jobs.tsv"
[ -f "$JOBS_TSV" ] || printf 'seq\tblock\tconfig\tkind\tfile\tstarted_utc\tloadavg_before\texit\n' >"$JOBS_TSV"
SEQ=$(($(wc -l <"$JOBS_TSV") - 1))

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log" >&2; }

# up NAME ARGS...: deploy/cluster.sh up with these flags, its whole output kept; sets the server
# and the token for ofctl.
up() {
    local name="$1"
    shift
    log "up $name: cluster.sh up $*"
    {
        echo "\$ uptime"; uptime
        echo "\$ bash deploy/cluster.sh up $*"
    } >"$OUT/cluster/$name.txt"
    "${CLUSTER[@]}" up "$@" >"$OUT/cluster/$name.stdout" 2>>"$OUT/cluster/$name.txt"
    local rc=$?
    cat "$OUT/cluster/$name.stdout" >>"$OUT/cluster/$name.txt"
    rm -f "$OUT/cluster/$name.stdout"
    echo "exit $rc" >>"$OUT/cluster/$name.txt"
    [ "$rc" = 0 ] || { log "up failed ($rc), see cluster/$name.txt"; exit 1; }
    SONIC_SERVER="$(tail -n 2 "$OUT/cluster/$name.txt" | head -n 1)"
    SONIC_TOKEN="$(sed -n 's/^SONIC_TOKEN=//p' "$REPO/.ci-data/cluster/secrets.env")"
    export SONIC_SERVER SONIC_TOKEN
    log "server $SONIC_SERVER"
}

# describe NAME: what runs (containers, images, creation times), the agents the control plane
# lists, the tier's and one agent's link classes, the tier's key count, the load.
describe() {
    local f="$OUT/cluster/$1-describe.txt"
    {
        echo "\$ date -u; uptime"; date -u; uptime
        echo "\$ docker ps -a --filter label=sonic.cluster (name, image id, created, status)"
        for c in $(docker ps -a --filter label=sonic.cluster --format '{{.Names}}' | sort); do
            docker inspect -f '{{.Name}} image={{.Image}} created={{.Created}} status={{.State.Status}} started={{.State.StartedAt}}' "$c"
        done
        echo "\$ docker images (sonic)"
        docker images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.CreatedAt}}' | grep '^sonic-' | sort
        echo "\$ ofctl get agents -o json"
        "$OFCTL" get agents -o json
        echo
        if docker inspect sonic-redis >/dev/null 2>&1; then
            echo "\$ docker exec sonic-redis redis-cli dbsize"
            docker exec sonic-redis redis-cli dbsize
            for dev in eth0 ifb0; do
                echo "\$ docker exec sonic-redis tc -s class show dev $dev"
                docker exec sonic-redis tc -s class show dev "$dev"
            done
        else
            echo "(no sonic-redis)"
        fi
        echo "\$ docker exec sonic-agent-2 tc -s class show dev eth0"
        docker exec sonic-agent-2 tc -s class show dev eth0
        echo "\$ docker exec sonic-agent-2 getent hosts sonic-store sonic-redis sonic-control"
        docker exec sonic-agent-2 getent hosts sonic-store sonic-redis sonic-control
        echo "\$ processes in sonic-agent-2 (a delay line would show as sonic-delay)"
        docker exec sonic-agent-2 sh -c 'for p in /proc/[0-9]*; do c=$(tr "\0" " " <$p/cmdline 2>/dev/null); [ -n "$c" ] && echo "${p#/proc/} $c"; done'
    } >"$f" 2>&1
}

# job BLOCK CONFIG KIND [ofctl run flags...]: one job, its summary in jobs/NNN-BLOCK-KIND.json.
job() {
    local block="$1" config="$2" kind="$3"
    shift 3
    SEQ=$((SEQ + 1))
    local name
    name="$(printf '%03d-%s-%s' "$SEQ" "$block" "$kind")"
    local load started
    load="$(cut -d' ' -f1-3 /proc/loadavg)"
    started="$(date -u +%FT%TZ)"
    timeout 600 "$OFCTL" run memory-mix2 --wait -o json "$@" >"$OUT/jobs/$name.json" 2>"$OUT/jobs/$name.err"
    local rc=$?
    [ -s "$OUT/jobs/$name.err" ] || rm -f "$OUT/jobs/$name.err"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$SEQ" "$block" "$config" "$kind" "jobs/$name.json" "$started" "$load" "$rc" >>"$JOBS_TSV"
    local line
    line="$(python3 - "$OUT/jobs/$name.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON ({e})"); sys.exit()
m = {f"{e['from']}->{e['to']}": e["method"] for e in d.get("edges", [])}
p = ((d.get("plan") or {}).get("report") or {}).get("predicted") or {}
print(d.get("status"), d.get("mode"), d.get("policy"), f"lat {d.get('latency_s', 0):.3f}",
      f"cost {d.get('cost_usd', 0):.7f}", "pred", p.get("latency_s"), p.get("cost_usd"), m)
PY
)"
    log "$name rc=$rc load=$load $line"
    LAST="$OUT/jobs/$name.json"
}

mode_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("mode",""))' "$1" 2>/dev/null; }

on_flags=(--agents 4 --no-build)
off_flags=(--agents 4 --no-build --no-memory-tier)

if [ "${SKIP_SETUP:-0}" != 1 ]; then
    log "REPO=$REPO OUT=$OUT ROUNDS=$ROUNDS PER=$PER"
    "${CLUSTER[@]}" up --agents 4 --dry-run >"$OUT/cluster/dry-run-on.json" 2>&1
    "${CLUSTER[@]}" up --agents 4 --no-memory-tier --dry-run >"$OUT/cluster/dry-run-off.json" 2>&1
    up 00-up-on "${on_flags[@]}"
    "${CLUSTER[@]}" status >"$OUT/cluster/00-status.txt" 2>&1
    describe 00-up-on
    "$OFCTL" apply -f "$DAG_FILE" >"$OUT/cluster/00-apply.txt" 2>&1 || { log "apply failed"; cat "$OUT/cluster/00-apply.txt"; exit 1; }

    # Profiling: until a job runs planned.
    planned=0
    for ((i = 1; i <= MAX_PROFILE; i++)); do
        job profile profiling profile
        if [ "$(mode_of "$LAST")" = planned ]; then planned=1; break; fi
    done
    "$OFCTL" models memory-mix2 -o json >"$OUT/cluster/00-models.json" 2>&1
    if [ "$planned" != 1 ]; then
        log "the models did not converge in $MAX_PROFILE jobs: stop"
        exit 3
    fi
fi

for ((r = 1; r <= ROUNDS; r++)); do
    # Tier on.
    if [ "$r" -gt 1 ] || [ "${SKIP_SETUP:-0}" = 1 ]; then up "on-$r-up" "${on_flags[@]}"; fi
    describe "on-$r-before"
    job "on-$r" on warmup
    for ((k = 1; k <= PER; k++)); do job "on-$r" on planned; done
    for ((k = 1; k <= PER; k++)); do
        if (((r + k) % 2 == 0)); then
            job "on-$r" on remote --policy remote
            job "on-$r" on memory --policy memory
        else
            job "on-$r" on memory --policy memory
            job "on-$r" on remote --policy remote
        fi
    done
    describe "on-$r-after"
    # Tier off.
    up "off-$r-up" "${off_flags[@]}"
    describe "off-$r-before"
    job "off-$r" off warmup
    for ((k = 1; k <= PER; k++)); do job "off-$r" off planned; done
    describe "off-$r-after"
done

# The tier back, for the checks at the end (a job with it after the last off-block).
up final-up "${on_flags[@]}"
job final on planned
describe final
log "done"
