#!/usr/bin/env bash
# A job under policy memory on the testbed, its keys in the tier sampled while it runs, and the
# tier after it: bash memory-job.sh DAG INPUT [PARAM...]
set -uo pipefail
OFCTL="${OFCTL:-target/debug/ofctl}"
dag="$1" input="$2"; shift 2
params=()
for p in "$@"; do params+=(--param "$p"); done
echo "\$ ofctl run $dag --input $input ${params[*]} --policy memory -o json"
submitted="$("$OFCTL" run "$dag" --input "$input" "${params[@]}" --policy memory -o json)"
echo "$submitted"
job="$(jq -r .job_id <<<"$submitted")"
echo "job: $job"
echo "--- the job's keys in the tier while it runs (docker exec sonic-redis redis-cli --scan --pattern 'sonic:jobs/$job/*', with STRLEN), every 0.5 s"
while :; do
    status="$("$OFCTL" describe job "$job" -o json | jq -r .status)"
    keys="$(docker exec sonic-redis redis-cli --scan --pattern "sonic:jobs/$job/*")"
    line="$(date +%T.%N | cut -c1-12) status=$status keys=$(grep -c . <<<"$keys")"
    for k in $keys; do line+=" ${k#sonic:jobs/$job/}=$(docker exec sonic-redis redis-cli strlen "$k")"; done
    echo "$line"
    case "$status" in succeeded | failed) break ;; esac
    sleep 0.5
done
echo "\$ ofctl describe job $job -o json"
"$OFCTL" describe job "$job" -o json
echo "\$ ofctl describe job $job -o json | jq -c '.status, .error, [.edges[] | {from, to, method, bytes}], .requests_usd, .storage_usd'"
"$OFCTL" describe job "$job" -o json | jq -c '.status, .error, [.edges[] | {from, to, method, bytes}], .requests_usd, .storage_usd'
echo "\$ docker exec sonic-redis redis-cli --scan --pattern 'sonic:jobs/$job/*' | wc -l"
docker exec sonic-redis redis-cli --scan --pattern "sonic:jobs/$job/*" | wc -l
echo "\$ docker exec sonic-redis redis-cli dbsize"
docker exec sonic-redis redis-cli dbsize
echo "\$ docker exec sonic-redis redis-cli info stats | grep -E 'total_commands_processed|total_net_input_bytes|total_net_output_bytes'"
docker exec sonic-redis redis-cli info stats | grep -E 'total_commands_processed|total_net_input_bytes|total_net_output_bytes'
echo "$job" >/tmp/last-memory-job
