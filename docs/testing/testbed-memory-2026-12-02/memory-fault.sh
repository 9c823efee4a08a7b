#!/usr/bin/env bash
# docker stop sonic-redis while gen's file for join waits in the tier (slow sleeps 6 s): what the
# job does; then the tier started again and the job run again; then a job while the tier is down.
set -uo pipefail
OFCTL="${OFCTL:-target/debug/ofctl}"
input="$1"
t0=$(date +%s)
echo "\$ ofctl run waiting --input $input --policy memory -o json"
job="$("$OFCTL" run waiting --input "$input" --policy memory -o json | jq -r .job_id)"
echo "job: $job"
echo "--- waiting for gen's file for join in the tier (sonic:jobs/$job/gen/0/join/*)"
while [ -z "$(docker exec sonic-redis redis-cli --scan --pattern "sonic:jobs/$job/gen/0/join/*")" ]; do sleep 0.1; done
echo "$(date +%T.%N | cut -c1-12) in the tier:"; docker exec sonic-redis redis-cli --scan --pattern "sonic:jobs/$job/*"
echo "$(date +%T.%N | cut -c1-12) \$ docker stop --time 1 sonic-redis"
docker stop --time 1 sonic-redis
echo "$(date +%T.%N | cut -c1-12) stopped; polling the job"
while :; do
    status="$("$OFCTL" describe job "$job" -o json | jq -r .status)"
    case "$status" in succeeded | failed) break ;; esac
    sleep 0.5
done
echo "$(date +%T.%N | cut -c1-12) ended: $status"
echo "\$ ofctl describe job $job -o json | jq '{status, error, edges: [.edges[] | {from, to, method, bytes}], functions: [.functions[] | {name, agent, attempts, error}]}'"
"$OFCTL" describe job "$job" -o json | jq '{status, error, edges: [.edges[] | {from, to, method, bytes}], functions: [.functions[] | {name, agent, attempts, error}]}'
echo "\$ ofctl describe job $job (table)"
"$OFCTL" describe job "$job"
echo "--- the daemons' log lines about the job or the tier since the job started"
for c in sonic-control sonic-agent-1 sonic-agent-2; do
    echo "[$c]"
    docker logs --since "$t0" "$c" 2>&1 | grep -iE "$job|memory|redis|tier" | cut -c1-600
done

echo "\$ docker start sonic-redis"
docker start sonic-redis
until [ "$(docker exec sonic-redis redis-cli ping 2>/dev/null)" = PONG ]; do sleep 0.2; done
echo "answers PING; its link shaped again:"
docker exec sonic-redis tc class show dev eth0
echo "\$ docker exec sonic-redis redis-cli dbsize   # restarted: empty (nothing kept)"
docker exec sonic-redis redis-cli dbsize
echo "\$ ofctl run waiting --input $input --policy memory --wait -o json | jq -c '.job_id, .status, .error, [.edges[] | {from, to, method}]'"
"$OFCTL" run waiting --input "$input" --policy memory --wait -o json | jq -c '.job_id, .status, .error, [.edges[] | {from, to, method}]'
echo "\$ docker exec sonic-redis redis-cli dbsize"
docker exec sonic-redis redis-cli dbsize

echo "--- the tier gone before a job"
echo "\$ docker stop --time 1 sonic-redis"
docker stop --time 1 sonic-redis
echo "\$ ofctl run waiting --input $input --policy memory --wait -o json | jq -c '.job_id, .status, .error, [.edges[] | {from, to, method, bytes}], .requests_usd'"
"$OFCTL" run waiting --input "$input" --policy memory --wait -o json | jq -c '.job_id, .status, .error, [.edges[] | {from, to, method, bytes}], .requests_usd'
echo "\$ docker start sonic-redis"
docker start sonic-redis
until [ "$(docker exec sonic-redis redis-cli ping 2>/dev/null)" = PONG ]; do sleep 0.2; done
echo "answers PING"
