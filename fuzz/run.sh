#!/usr/bin/env bash
# Runs one cargo-fuzz target for a number of executions with its seeds and prints what docs/security.md
# records: executions, seconds, executions per second, crashes.
#
#   bash fuzz/run.sh dag_yaml              # 1,000,000 executions
#   bash fuzz/run.sh api_requests 200000   # fewer
#   bash fuzz/run.sh dag_yaml 1000000 -max_total_time=1200   # extra libFuzzer flags
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`). `-s none`: no
# AddressSanitizer (safe Rust; about three times faster). A crash stops the run and lands in
# fuzz/artifacts/<target>/; replay it with `cargo +nightly fuzz run -s none <target> <file>`.
set -euo pipefail
dict=yaml.dict
cd "$(dirname "$0")"
target="${1:?usage: run.sh TARGET [RUNS]}"
runs="${2:-1000000}"
shift $(($# > 1 ? 2 : 1))
case "$target" in
    dag_yaml) seeds=(../dags ../tests/fixtures/bad-dags ../tests/fixtures/plan) ;;
    params_yaml) seeds=(../tests/fixtures/plan) ;;
    catalog_yaml) seeds=(../deploy ../tests/fixtures/plan) ;;
    api_requests) seeds=(seeds/api_requests); dict=json.dict ;;
    *) echo "run.sh: unknown target $target" >&2; exit 2 ;;
esac
mkdir -p "corpus/$target"
cargo +nightly fuzz build -s none "$target"
start=$(date +%s.%N)
set +e
cargo +nightly fuzz run -s none "$target" "corpus/$target" "${seeds[@]}" -- \
    -runs="$runs" -dict="$dict" -max_len=4096 -print_final_stats=1 "$@" 2>&1 | tee "corpus/$target.log"
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "corpus/$target.log" | grep -o '[0-9]*$' || echo 0)
crashes=$(find "artifacts/$target" -type f 2>/dev/null | wc -l)
secs=$(echo "$end - $start" | bc)
printf 'target=%s executions=%s seconds=%.0f exec_per_s=%.0f crashes=%s exit=%s\n' \
    "$target" "$execs" "$secs" "$(echo "$execs / $secs" | bc -l)" "$crashes" "$rc"
exit "$rc"
