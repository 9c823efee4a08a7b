#!/usr/bin/env bash
# Right-sizing measured on this machine (docs/model.md, "Right-sizing"): the ML pipeline with one
# train instance fitting 4 trees, profiled on `ofctl up`'s Docker agents until its models
# converge (every other profiling job gives each instance 2 CPUs, the others 1), then planned
# jobs. Writes jobs.jsonl (every job summary), models.json (the models at the end) and load.txt.
# Usage: bash docs/testing/rightsizing-2026-12-02/run.sh OUT_DIR   (from the checkout, after
# `cargo build -p ofctl -p sonic-lambdas` and `bash deploy/build-images.sh --debug`)
set -euo pipefail
out="${1:?OUT_DIR}"
mkdir -p "$out"
data="$(mktemp -d)"
export XDG_CONFIG_HOME="$data/config"
ofctl=target/debug/ofctl
$ofctl up --agents 2 --sandbox docker --data-dir "$data/sonic" --listen 127.0.0.1:7100 \
    --no-memory-tier > "$out/up.txt" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 120); do
    grep -q "^server" "$out/up.txt" 2>/dev/null && break
    sleep 1
done
$ofctl apply -f dags/ml-pipeline.yaml > /dev/null
: > "$out/jobs.jsonl"
uptime > "$out/load.txt"
run() {
    local rows=$1
    target/debug/sonic-gen ml --rows "$rows" > "$data/ml-$rows.csv"
    $ofctl run ml-pipeline --input "$data/ml-$rows.csv" --param trees=1 \
        --param trees_per_instance=4 --wait -o json | tr -d '\n' >> "$out/jobs.jsonl"
    echo >> "$out/jobs.jsonl"
}
# Profiling, then planned: sizes in turn.
for rows in 8000 16000 24000 32000 12000 20000 28000 36000 10000 30000 18000 26000; do
    run "$rows"
done
uptime >> "$out/load.txt"
$ofctl models ml-pipeline --param trees=1 --param trees_per_instance=4 -o json > "$out/models.json"
