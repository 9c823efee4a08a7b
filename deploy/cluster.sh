#!/usr/bin/env bash
# A Sonic cluster of containers on this machine (interfaces.md §4): every container is a host with
# its own address on the private Docker network `sonic`.
#
#   bash deploy/cluster.sh up [--agents N | --vms TYPE:N,...] [--scale F | --dilation D|auto]
#                             [--sandbox process|docker] [--tls] [--lambdas DIR] [--release]
#                             [--catalog FILE] [--plan-catalog FILE] [--store-delay-ms MS]
#                             [--no-memory-tier | --memory-tier-mb MB] [--memory-delay-ms MS]
#                             [--no-build] [--dry-run]
#   bash deploy/cluster.sh status [-o table|json]
#   bash deploy/cluster.sh down
#
# Containers (names fixed: scripts kill, cut off and restart them by name):
#   sonic-store                    SeaweedFS (`weed mini`), S3 on sonic-store:8333 (not published)
#   sonic-redis                    the memory tier: Debian's redis-server on sonic-redis:6379 (not
#                                  published; nothing kept: --save '' --appendonly no), its link
#                                  shaped as the agents' are; absent with --no-memory-tier
#   sonic-control                  the control plane; its database on the volume sonic-control-data,
#                                  so `docker restart sonic-control` keeps it; port 7000 published on
#                                  127.0.0.1:PORT (7000 when free, else a free one; SONIC_CLUSTER_PORT
#                                  forces one)
#   sonic-agent-1 ... sonic-agent-N  one agent each (agent id = container name), VM types in catalog
#                                  order, repeating
#
# up: builds the images when their content changed (deploy/images/build.sh; with --sandbox docker
#     also sonic-lambdas:latest with deploy/build-images.sh), creates what is missing or differs and
#     keeps what already runs as asked (so `up` twice is quick), waits until every agent has joined
#     (SONIC_CLUSTER_TIMEOUT seconds, default 180), saves the ofctl context
#     (${XDG_CONFIG_HOME:-~/.config}/sonic/config.json) and prints the server URL as its last line.
#   --agents N        agents (default 4, as `ofctl up`), VM types in catalog order, repeating
#   --vms TYPE:N,...  one agent per VM, these types in this order (e.g. m5.large:4,m5.xlarge:2);
#                     instead of --agents
#   --sandbox S       process (default): lambdas run as processes inside the agent's container;
#                     docker: as sibling containers of sonic-lambdas:latest (the Docker socket and
#                     the agent's data folder .ci-data/cluster/agent-N are mounted at the same path)
#   --scale F         each agent container gets --cpus vcpus*F, --memory memory_mb*F (>= 256 MiB)
#                     and a link of network_mbps*F each way; it still declares its type's
#                     vCPUs and memory. Default: min(1, cores / sum of the agents' vCPUs)
#                     Links: every agent runs through sonic-link (deploy/images/sonic-link.sh,
#                     --cap-add NET_ADMIN, dropped before the agent starts), which shapes its
#                     container's interface with Linux traffic control (htb; ingress through an
#                     ifb device) at that rate; the agent only declares it
#                     (SONIC_AGENT_LIMIT_NETWORK=false), so Sonic's own token buckets, which are
#                     the model's formula, stay out of the testbed. The store is SeaweedFS as it
#                     is, behind a plain delay line (--store-delay-ms); deploy/measure-store.sh
#                     measures what an agent gets from both.
#                     The memory tier (sonic-redis) is a host of its own too: the control plane
#                     gets --memory-tier redis://sonic-redis:6379 (SONIC_MEMORY_TIER) and the
#                     agents get it when they join. Redis runs with --maxmemory MB
#                     --maxmemory-policy noeviction (a full tier refuses a file, which then goes
#                     to the store) behind sonic-link: its eth0 and, through ifb0, its ingress at
#                     the catalog's memory_tier network_mbps / D (its built-in 750 Mbit/s when the
#                     catalog has no memory_tier; not scaled by --scale: the control plane plans
#                     with the tier's own figure), so that the tier's node is the bottleneck all
#                     the VMs share, as the model has it.
#   --dilation D      a time-dilated cluster (DieCast): instead of --scale, each agent gets
#                     --cpus vcpus/D, its type's memory (memory does not dilate), a link of
#                     network_mbps/D, and its traffic to and from the store's port capped at the
#                     catalog's remote_storage write_mbps/D and read_mbps/D (one VM's
#                     connection, shaped by the kernel as above); the control plane plans with
#                     the catalog dilated by D
#                     (SONIC_CONTROL_DILATION). Times the cluster reports are D times the emulated
#                     ones (docs/evaluation.md). auto: D = max(1, vCPUs / (cores - 1)), to a
#                     hundredth: one core is left outside the agents' quotas for what is not
#                     dilated (the store, the control plane); a D that leaves less is warned of.
#                     The containers run under a CPU cgroup of their own (/sonic-dilated, heavily
#                     weighted: prepare_cgroup says why), so the agents get their quotas first.
#   --store-delay-ms MS  a delay line in front of the store in every agent (sonic-delay): each
#                     request to the store takes MS x D more (emulated: MS); default on a dilated
#                     cluster the catalog's remote_storage request_latency_ms, else 0 (none)
#   --no-memory-tier  no sonic-redis: the control plane has no memory tier (policy memory is
#                     refused; plans never use it); `up` removes a tier an earlier `up` started
#   --memory-tier-mb MB  the tier's --maxmemory (default: the catalog's memory_tier capacity_mb;
#                     512 when the catalog prices no tier: the built-in tier's 13,383 MB is more
#                     than a test machine should give; the control plane still plans with it)
#   --memory-delay-ms MS  a delay line in front of the tier in every agent (sonic-delay, as the
#                     store's): each request to it takes MS x D more (emulated: MS); default on a
#                     dilated cluster the tier's request_latency_ms (0.5: 8 ms at D = 16), else 0
#   --dry-run         print what the agents would get (one JSON document) and start nothing
#   --tls             certificates from deploy/certs.sh in .ci-data/cluster/tls; each daemon gets
#                     ca.pem and its own NAME.pem/NAME.key read-only in /etc/sonic/tls (never
#                     ca.key); every URL is https://, the ofctl context names the CA (ca_file)
#   --lambdas DIR     mounted read-only at the same path in every agent, searched first for commands
#   --release         binaries from target/release (default target/debug)
#   --catalog FILE    VM types (default deploy/catalog.yaml): what the testbed emulates (each
#                     agent's CPU, memory, link, its link to the store and the store's delay
#                     line come from it); mounted into the control plane unless --plan-catalog
#   --plan-catalog FILE  what the control plane plans with instead (same VM types), e.g. the
#                     catalog deploy/measure-store.sh wrote: the store as measured through the
#                     links, while the links stay those of --catalog
#   --no-build        skip cargo build (use the binaries in target/)
# Secrets (API token, join token) are kept in .ci-data/cluster/secrets.env (mode 0600) and reused.
# SONIC_CLUSTER_CORES=N stands for this machine's cores (nproc) in the defaults above.
# SONIC_CLUSTER_STORE_PORT=P publishes the store's S3 port on 127.0.0.1:P (debugging only).
# The control plane takes request bodies up to 1GiB (`ofctl run --input FILE` sends the file inline,
# base64, as with `ofctl up`); SONIC_CLUSTER_MAX_BODY changes that. SONIC_CLUSTER_LOG sets RUST_LOG.
# SONIC_CLUSTER_STORE_OUTAGE_MS: how long the control plane and (told when they join) the agents
# wait out a store outage before failing (default 30000).
# SONIC_CLUSTER_MEMORY_PORT=P publishes the memory tier's port on 127.0.0.1:P (debugging only).
# down: removes the containers (and the lambda containers agents started), the network, the
#     volumes, the agents' folders and the dilated cluster's cgroup; keeps the secrets and
#     certificates; exit 0 when nothing is there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.ci-data/cluster"
SECRETS="$STATE/secrets.env"
STATE_FILE="$STATE/cluster.json"
NET=sonic
STORE=sonic-store
CONTROL=sonic-control
REDIS=sonic-redis
REDIS_PORT=6379
REDIS_IMAGE=sonic-redis:latest
AGENT_IMAGE=sonic-agent-host:latest
CONTROL_IMAGE=sonic-control:latest
STORE_IMAGE=sonic-store:latest
LAMBDA_IMAGE=sonic-lambdas:latest
LABEL=sonic.cluster=1
AGENT_PORT=7070
CONTROL_PORT=7000
TLS_IN=/etc/sonic/tls
# A dilated cluster's containers run in a CPU cgroup of their own (prepare_cgroup says why).
DILATED_CGROUP=sonic-dilated

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

need() {
    command -v docker >/dev/null || die "docker is not installed"
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
        die "the Docker engine does not answer: start it (e.g. 'service docker start')"
    command -v python3 >/dev/null || die "python3 is needed (catalog, JSON)"
    command -v curl >/dev/null || die "curl is needed (apt-get install curl)"
}

exists() { docker container inspect "$1" >/dev/null 2>&1; }
running() { [ "$(docker container inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

# The containers of a cluster, by label and by name (labels could be missing on a hand-made one).
cluster_containers() {
    {
        docker ps -aq --filter "label=$LABEL"
        docker ps -aq --filter "name=^/${STORE}\$" --filter "name=^/${CONTROL}\$" --filter "name=^/${REDIS}\$"
        docker ps -aq --filter 'name=^/sonic-agent-[0-9]+$'
    } | sort -u
}

# --- secrets and state ---------------------------------------------------------------------------

hex32() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

load_secrets() {
    mkdir -p "$STATE"
    chmod 0700 "$STATE"
    if [ ! -s "$SECRETS" ]; then
        (
            umask 077
            {
                echo "SONIC_TOKEN=$(hex32)"
                echo "SONIC_JOIN_TOKEN=$(hex32)"
                echo "SONIC_FILE_KEY=$(hex32)"
            } >"$SECRETS.tmp"
            mv "$SECRETS.tmp" "$SECRETS"
        )
        log "generated secrets in $SECRETS"
    fi
    chmod 0600 "$SECRETS"
    API_TOKEN="$(sed -n 's/^SONIC_TOKEN=//p' "$SECRETS")"
    JOIN_TOKEN="$(sed -n 's/^SONIC_JOIN_TOKEN=//p' "$SECRETS")"
    FILE_KEY="$(sed -n 's/^SONIC_FILE_KEY=//p' "$SECRETS")"
    if [ -z "$API_TOKEN" ] || [ -z "$JOIN_TOKEN" ] || [ -z "$FILE_KEY" ]; then
        die "$SECRETS is incomplete: remove it and run up again"
    fi
}

# state_get KEY: a field of .ci-data/cluster/cluster.json (empty when absent).
state_get() {
    [ -f "$STATE_FILE" ] || return 0
    python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else (str(v).lower() if isinstance(v,bool) else v))' \
        "$STATE_FILE" "$1" 2>/dev/null || true
}

# --- the catalog ---------------------------------------------------------------------------------

# plan_agents CATALOG AGENTS VMS SCALE DILATION CORES STORE_DELAY MEMORY MEMORY_MB MEMORY_DELAY:
# what every agent container gets, as one JSON document (printed by `up --dry-run`; the rest of
# `up` reads it): the VM types in order (from --vms, else the catalog's, repeating, for --agents),
# and per agent its CPU quota, memory limit, network rate, link to the store, the store's delay
# line and the memory tier's, with the scale or dilation that made them; and the memory tier's
# container (MEMORY is 0 for none: null), its link, --maxmemory and where its figures came from.
# Exit 2 on bad input.
plan_agents() {
    python3 - "$@" <<'PY'
import json, math, re, sys

path, agents, vms_arg, scale_arg, dilation_arg, cores, delay_arg, memory_arg, memory_mb_arg, memory_delay_arg = sys.argv[1:11]
cores = int(cores)

def fail(msg, code=1):
    print(f"cluster: {msg}", file=sys.stderr)
    sys.exit(code)

text = open(path).read()
try:
    import yaml
    doc = yaml.safe_load(text) or {}
except ImportError:
    # No PyYAML: the catalog's own style: flow or block mappings under vm_types (a list) and
    # remote_storage (a mapping, a flow one may span lines).
    def scalar(v):
        v = v.strip().strip("'\"")
        try:
            return float(v) if re.search(r"[.eE]", v) else int(v)
        except ValueError:
            return v
    def pairs(body, into):
        for part in body.strip().strip("{}").split(","):
            if ":" in part:
                k, v = part.split(":", 1)
                into[k.strip()] = scalar(v)
    doc, section, cur, pending = {}, None, None, ""
    for line in text.splitlines():
        s = line.split("#", 1)[0].rstrip()
        if not s.strip():
            continue
        if pending:
            pending += " " + s.strip()
            if "}" in s:
                pairs(pending, doc[section]); pending = ""
            continue
        top = re.match(r"^(\w+):\s*(.*)$", s)
        if top:
            section, rest = top.group(1), top.group(2)
            if section == "vm_types":
                doc[section] = []
            elif rest.startswith("{"):
                doc[section] = {}
                if "}" in rest:
                    pairs(rest, doc[section])
                else:
                    pending = rest
            elif rest:
                doc[section] = scalar(rest)
            else:
                doc[section] = {}
            continue
        if section == "vm_types":
            m = re.match(r"^\s*-\s*(.*)$", s)
            if m:
                cur = {}
                doc["vm_types"].append(cur)
                pairs(m.group(1), cur)
            elif cur is not None:
                pairs(s, cur)
        elif isinstance(doc.get(section), dict):
            pairs(s, doc[section])
except Exception as e:  # noqa: BLE001
    fail(f"{path}: {e}")
types = []
for vm in doc.get("vm_types") or []:
    try:
        types.append({"name": str(vm["name"]), "vcpus": int(vm["vcpus"]),
                      "memory_mb": int(vm["memory_mb"]), "network_mbps": float(vm["network_mbps"])})
    except (KeyError, ValueError, TypeError):
        fail(f"{path}: a vm_type lacks name, vcpus, memory_mb or network_mbps: {vm}")
if not types:
    fail(f"{path}: no vm_types")
by_name = {t["name"]: t for t in types}

# The VMs, one agent each.
if vms_arg:
    order = []
    for item in vms_arg.split(","):
        name, sep, count = item.strip().rpartition(":")
        if not sep or not name or not re.fullmatch(r"[1-9][0-9]*", count):
            fail(f"--vms takes TYPE:COUNT,... (e.g. m5.large:4,m5.xlarge:2), not {item!r}", 2)
        if name not in by_name:
            fail(f"--vms: {name} is not a VM type of {path} ({', '.join(by_name)})", 2)
        order += [by_name[name]] * int(count)
else:
    order = [types[i % len(types)] for i in range(int(agents))]
if len(order) > 200:
    fail(f"{len(order)} agents: at most 200", 2)
vcpus = sum(t["vcpus"] for t in order)

def num(s, what, lo, hi):
    try:
        f = float(s)
    except ValueError:
        f = float("nan")
    if not (lo < f <= hi) or math.isnan(f):
        fail(f"{what} takes a number in ({lo:g}, {hi:g}], not {s!r}", 2)
    return f

# A dilated agent's CPU quota period, microseconds (rows below say why).
CPU_PERIOD_US = 10000

# The cores a dilated cluster's agents may take: all but one (one core is all there is).
agent_cores = cores - 1 if cores >= 2 else cores

scale = dilation = None
if dilation_arg:
    if dilation_arg == "auto":
        # Enough that the agents' quotas (vCPUs / D) fit the cores less one, left to what is
        # not dilated (the store, the control plane, ofctl: they would otherwise take CPU the
        # agents were given, and the agents theirs); at least 1; rounded up to a hundredth.
        dilation = max(1.0, math.ceil(vcpus / agent_cores * 100 - 1e-9) / 100)
    else:
        dilation = num(dilation_arg, "--dilation", 0, 1000)
        if dilation < 1:
            fail(f"--dilation takes a number >= 1 or auto, not {dilation_arg!r}", 2)
elif scale_arg:
    scale = num(scale_arg, "--scale", 0, 64)
else:
    scale = math.floor(min(1.0, cores / vcpus) * 10000) / 10000

def short(x):
    return float(f"{x:.4f}")

# A dilated agent's link to the store: one VM's connection, each way, D times slower (sonic-link
# caps it at the VM's own rate too). The kernel here cannot add delay: a delay line in front of
# the store (sonic-delay) holds what an agent sends it for --store-delay-ms x D (default on a
# dilated cluster: the catalog's request_latency_ms; else none); the store's own latency comes on
# top (deploy/measure-store.sh measures the sum for the testbed's catalog).
r = doc.get("remote_storage") or {}
delay_ms = 0.0
if delay_arg:
    try:
        delay_ms = float(delay_arg)
    except ValueError:
        delay_ms = float("nan")
    if not 0 <= delay_ms <= 60000:
        fail(f"--store-delay-ms takes milliseconds from 0 to 60000, not {delay_arg!r}", 2)
elif dilation is not None:
    try:
        delay_ms = float(r.get("request_latency_ms", 25))
    except (TypeError, ValueError):
        fail(f"{path}: remote_storage figures must be numbers: {r}")
store = None
if dilation is not None:
    try:
        store = {"write_mbps": short(float(r.get("write_mbps", 600)) / dilation),
                 "read_mbps": short(float(r.get("read_mbps", 400)) / dilation)}
    except (TypeError, ValueError):
        fail(f"{path}: remote_storage figures must be numbers: {r}")
store_delay_ms = short(delay_ms * (dilation or 1.0))
if store_delay_ms > 60000:
    fail(f"a store delay of {store_delay_ms:g} ms (--store-delay-ms x D): at most 60000", 2)

# The memory tier: a node of its own (sonic-redis) whose link every VM's transfers share, at the
# catalog's memory_tier network_mbps / D (the built-in tier's when the catalog has none, as the
# control plane prices it then); not scaled by --scale (the control plane plans with the tier's
# own figure, dilated only). Its latency, as the store's, is a delay line in every agent:
# --memory-delay-ms x D (default on a dilated cluster the tier's request_latency_ms, else 0).
# Its --maxmemory: --memory-tier-mb, else the catalog's capacity_mb, else 512 MB (this machine's
# share; the built-in tier's 13,383 MB is what the control plane plans with then).
BUILTIN_TIER = {"usd_per_hour": 0.206, "capacity_mb": 13383, "network_mbps": 750.0,
                "request_latency_ms": 0.5, "requests_per_s": 100000.0}
DEFAULT_MAXMEMORY_MB = 512
memory = None
memory_delay_ms = 0.0
if memory_arg != "0":
    priced = doc.get("memory_tier")
    if priced is not None and not isinstance(priced, dict):
        fail(f"{path}: memory_tier must be a mapping: {priced}")
    tier = dict(BUILTIN_TIER)
    tier.update(priced or {})
    try:
        t_net = float(tier["network_mbps"])
        t_latency = float(tier["request_latency_ms"])
        t_capacity = int(tier["capacity_mb"])
    except (TypeError, ValueError):
        fail(f"{path}: memory_tier figures must be numbers: {priced}")
    if not (t_net > 0 and t_latency >= 0 and t_capacity > 0):
        fail(f"{path}: memory_tier needs network_mbps > 0, request_latency_ms >= 0, capacity_mb > 0: {priced}")
    if memory_mb_arg:
        if not re.fullmatch(r"[1-9][0-9]*", memory_mb_arg) or int(memory_mb_arg) > 1048576:
            fail(f"--memory-tier-mb takes megabytes from 1 to 1048576, not {memory_mb_arg!r}", 2)
        maxmemory = int(memory_mb_arg)
        maxmemory_from = "--memory-tier-mb"
    elif priced is not None:
        maxmemory = t_capacity
        maxmemory_from = "catalog"
    else:
        maxmemory = DEFAULT_MAXMEMORY_MB
        maxmemory_from = "default"
    if memory_delay_arg:
        try:
            memory_delay_ms = float(memory_delay_arg)
        except ValueError:
            memory_delay_ms = float("nan")
        if not 0 <= memory_delay_ms <= 60000:
            fail(f"--memory-delay-ms takes milliseconds from 0 to 60000, not {memory_delay_arg!r}", 2)
    elif dilation is not None:
        memory_delay_ms = t_latency
    memory_delay_ms = short(memory_delay_ms * (dilation or 1.0))
    if memory_delay_ms > 60000:
        fail(f"a memory tier delay of {memory_delay_ms:g} ms (--memory-delay-ms x D): at most 60000", 2)
    memory = {"name": "sonic-redis", "url": "redis://sonic-redis:6379",
              "catalog": "catalog" if priced is not None else "built-in",
              "network_mbps": short(t_net / (dilation or 1.0)),
              "maxmemory_mb": maxmemory, "maxmemory_from": maxmemory_from,
              "capacity_mb": t_capacity, "delay_ms": memory_delay_ms}
elif memory_mb_arg or memory_delay_arg:
    fail("--no-memory-tier: --memory-tier-mb and --memory-delay-ms have no tier to apply to", 2)

rows = []
for n, t in enumerate(order, 1):
    f = 1.0 / dilation if dilation is not None else scale
    want = t["vcpus"] * f
    # Docker refuses a quota above the machine's cores: such an agent gets them all.
    cpus = short(min(cores, max(0.01, want)))
    # Memory does not dilate: a dilated agent has its type's memory.
    mem = t["memory_mb"] if dilation is not None else max(256, int(t["memory_mb"] * f))
    # A dilated agent's quota is enforced over a short period (CPU_PERIOD_US, not Docker's
    # 100 ms): CFS throttles a container only once it has used its quota of the period, so
    # work shorter than that share (a process start, a request handled between two waits) runs
    # at full speed, undilated. The kernel takes a quota of at least 1 ms.
    period = quota = None
    if dilation is not None:
        period = max(CPU_PERIOD_US, math.ceil(1000 / cpus))
        quota = max(1000, round(cpus * period))
    rows.append({"name": f"sonic-agent-{n}", "vm_type": t["name"], "vcpus": t["vcpus"],
                 "memory_mb": t["memory_mb"], "cpus": cpus, "cpus_capped": want > cores,
                 "cpu_period_us": period, "cpu_quota_us": quota,
                 "memory_limit_mb": mem, "network_mbps": short(t["network_mbps"] * f),
                 "store": store, "store_delay_ms": store_delay_ms,
                 "memory_delay_ms": memory_delay_ms})
quotas = short(sum(r["cpus"] for r in rows))
print(json.dumps({"catalog": path, "cores": cores, "vcpus": vcpus, "scale": scale, "links": "kernel",
                  "dilation": dilation, "agent_cpus": quotas,
                  "free_cores": short(max(0.0, cores - quotas)), "memory_tier": memory,
                  "agents": rows}))
PY
}

# --- ports ---------------------------------------------------------------------------------------

port_free() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The host port of a running control container, if any.
published_port() {
    docker port "$CONTROL" "$CONTROL_PORT/tcp" 2>/dev/null | sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' | head -n 1
}

choose_port() {
    local p
    if [ -n "${SONIC_CLUSTER_PORT:-}" ]; then
        p="$SONIC_CLUSTER_PORT"
        if [ "$(published_port)" != "$p" ] && ! port_free "$p"; then
            die "SONIC_CLUSTER_PORT=$p is taken on 127.0.0.1"
        fi
        echo "$p"
        return
    fi
    p="$(published_port)"
    if [ -n "$p" ]; then echo "$p"; return; fi
    p="$(state_get port)"
    if [ -n "$p" ] && port_free "$p"; then echo "$p"; return; fi
    if port_free 7000; then echo 7000; return; fi
    p="$(free_port)"
    log "127.0.0.1:7000 is taken; the control plane gets 127.0.0.1:$p"
    echo "$p"
}

# --- HTTP to the control plane -------------------------------------------------------------------

# control_get PATH: GET on the published control plane with the API token; body on stdout.
control_get() {
    local args=(-sS --fail --max-time 5 -H "Authorization: Bearer $API_TOKEN")
    if [ "$TLS" = 1 ]; then args+=(--cacert "$STATE/tls/ca.pem"); fi
    curl "${args[@]}" "$SERVER$1"
}

# joined_agents: the ids of the agents the control plane lists as alive and registered since
# their container last started (an agent replaced a moment ago still shows alive until its
# heartbeat times out), one a line.
joined_agents() {
    local ids started
    ids="$(docker ps -q --filter 'name=^/sonic-agent-[0-9]+$')"
    started=""
    if [ -n "$ids" ]; then
        # shellcheck disable=SC2086
        started="$(docker inspect -f '{{.Name}} {{.State.StartedAt}}' $ids 2>/dev/null || true)"
    fi
    control_get /v1/agents 2>/dev/null | STARTED="$started" python3 -c '
import datetime, json, os, sys
started = {}
for line in os.environ.get("STARTED", "").splitlines():
    name, _, at = line.strip().lstrip("/").partition(" ")
    try:
        day, _, frac = at.rstrip("Z").partition(".")
        t = datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.timezone.utc).timestamp()
        started[name] = (t + float("0." + (frac or "0")[:6])) * 1000
    except ValueError:
        pass
try:
    doc = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for a in doc.get("agents", []) if isinstance(doc, dict) else []:
    name = a.get("agent_id") or ""
    if not a.get("alive", True) or name not in started:
        continue
    if (a.get("registered_at_ms") or 0) + 50 < started[name]:
        continue  # the registration of the container this one replaced
    print(name)
' || true
}

# --- the dilated cluster's CPU weight ------------------------------------------------------------

# prepare_cgroup: prints the --cgroup-parent a dilated cluster's containers get, or nothing (and
# warns) when it cannot be made. A dilated agent must run at its quota (vCPUs / D), not slower:
# its quota is the emulation. But Docker puts every container under one cgroup (`docker`) that,
# with the cgroupfs driver, weighs as much as a single process of nice 0 against every other
# process of this machine (cgroup v1: all in the root cgroup), so on a busy machine (a few
# compilers, even at nice 10) the agents together get less than their quotas and run slower
# than their VMs / D: a slowdown that does not scale with D. Under a cgroup of their own with a
# large weight they get their quotas first; the quotas still cap what the agents take, and what
# the store and the control plane take is what they need (they are not dilated).
prepare_cgroup() {
    local info
    info="$(docker info -f '{{.CgroupDriver}} {{.CgroupVersion}}' 2>/dev/null || true)"
    case "$info" in
        "cgroupfs 1")
            if mkdir -p "/sys/fs/cgroup/cpu/$DILATED_CGROUP" 2>/dev/null &&
                echo 65536 >"/sys/fs/cgroup/cpu/$DILATED_CGROUP/cpu.shares" 2>/dev/null; then
                echo "/$DILATED_CGROUP"
                return
            fi ;;
        "cgroupfs 2")
            if mkdir -p "/sys/fs/cgroup/$DILATED_CGROUP" 2>/dev/null &&
                echo 10000 >"/sys/fs/cgroup/$DILATED_CGROUP/cpu.weight" 2>/dev/null; then
                echo "/$DILATED_CGROUP"
                return
            fi ;;
    esac
    log "warning: cannot give the dilated cluster a CPU cgroup of its own (Docker: ${info:-?}; needs the cgroupfs driver and root): on a busy machine its agents may get less than their quotas"
}

# remove_cgroup: the dilated cluster's cgroup, once empty (in every hierarchy runc made it in).
remove_cgroup() {
    local d
    for d in /sys/fs/cgroup/*/"$DILATED_CGROUP" "/sys/fs/cgroup/$DILATED_CGROUP"; do
        [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
    done
}

# --- container creation --------------------------------------------------------------------------

# ensure NAME IMAGE ARGS... -- CMD...: the container runs with exactly these settings. A running
# container made from the same settings and image is kept; otherwise it is (re)created.
ensure() {
    local name="$1" image="$2"
    shift 2
    local args=() cmd=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ "$#" -gt 0 ] && shift
    cmd=("$@")
    local image_id spec current
    image_id="$(docker image inspect -f '{{.Id}}' "$image")"
    spec="$(printf '%s\n' "$image_id" "${args[@]}" -- "${cmd[@]}" | sha256sum | cut -c1-16)"
    current="$(docker container inspect -f '{{index .Config.Labels "sonic.spec"}}' "$name" 2>/dev/null || true)"
    if [ "$current" = "$spec" ] && running "$name"; then
        log "$name: running as asked"
        return
    fi
    if exists "$name"; then
        log "$name: recreating"
        docker rm -f "$name" >/dev/null
    else
        log "$name: starting"
    fi
    docker run -d --name "$name" --hostname "$name" --network "$NET" \
        --label "$LABEL" --label "sonic.spec=$spec" \
        --log-opt max-size=20m --log-opt max-file=2 \
        "${args[@]}" "$image" "${cmd[@]}" >/dev/null
}

ensure_network() {
    if docker network inspect "$NET" >/dev/null 2>&1; then return; fi
    log "creating network $NET"
    docker network create --driver bridge --label "$LABEL" "$NET" >/dev/null
}

ensure_volume() {
    if docker volume inspect "$1" >/dev/null 2>&1; then return; fi
    docker volume create --label "$LABEL" "$1" >/dev/null
}

# Last log lines of a container, for an error.
show_logs() {
    local name="$1"
    echo "---- $name ($(docker container inspect -f '{{.State.Status}} exit={{.State.ExitCode}}' "$name" 2>/dev/null || echo missing)): last log lines" >&2
    docker logs --tail 25 "$name" 2>&1 | sed 's/^/    /' >&2 || true
}

save_context() {
    local dir file tmp
    dir="${XDG_CONFIG_HOME:-$HOME/.config}/sonic"
    file="$dir/config.json"
    mkdir -p "$dir"
    tmp="$dir/.config.json.$$"
    (
        umask 077
        python3 - "$tmp" "$SERVER" "$API_TOKEN" "$([ "$TLS" = 1 ] && echo "$STATE/tls/ca.pem")" <<'PY'
import json, sys
path, server, token, ca = sys.argv[1:5]
doc = {"server": server, "token": token}
if ca:
    doc["ca_file"] = ca
with open(path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
PY
    )
    chmod 0600 "$tmp"
    mv "$tmp" "$file"
    log "saved the ofctl context in $file"
}

# --- up ------------------------------------------------------------------------------------------

cmd_up() {
    local agents=4 sandbox=process scale="" lambdas="" profile=debug build=1
    local vms="" dilation="" dry_run=0 agents_given=0 store_delay=""
    local memory=1 memory_mb="" memory_delay=""
    local catalog="$ROOT/deploy/catalog.yaml" plan_catalog=""
    TLS=0
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --agents | --sandbox | --scale | --lambdas | --catalog | --vms | --dilation | --store-delay-ms | --plan-catalog | --memory-tier-mb | --memory-delay-ms)
                [ "$#" -ge 2 ] || { log "$1 needs a value"; exit 2; } ;;
        esac
        case "$1" in
            --agents) agents="${2:-}"; agents_given=1; shift 2 ;;
            --vms) vms="${2:-}"; shift 2 ;;
            --dilation) dilation="${2:-}"; shift 2 ;;
            --store-delay-ms) store_delay="${2:-}"; shift 2 ;;
            --no-memory-tier) memory=0; shift ;;
            --memory-tier-mb) memory_mb="${2:-}"; shift 2 ;;
            --memory-delay-ms) memory_delay="${2:-}"; shift 2 ;;
            --dry-run) dry_run=1; shift ;;
            --sandbox) sandbox="${2:-}"; shift 2 ;;
            --scale) scale="${2:-}"; shift 2 ;;
            --tls) TLS=1; shift ;;
            --lambdas) lambdas="${2:-}"; shift 2 ;;
            --release) profile=release; shift ;;
            --debug) profile=debug; shift ;;
            --catalog) catalog="${2:-}"; shift 2 ;;
            --plan-catalog) plan_catalog="${2:-}"; shift 2 ;;
            --no-build) build=0; shift ;;
            -h | --help) usage 0 ;;
            *) log "up: unknown argument $1"; usage 2 ;;
        esac
    done
    [[ "$agents" =~ ^[1-9][0-9]*$ ]] || { log "--agents takes a positive number"; exit 2; }
    if [ -n "$vms" ] && [ "$agents_given" = 1 ]; then
        log "--agents and --vms: give one (--vms names every agent's VM type)"
        exit 2
    fi
    if [ -n "$dilation" ] && [ -n "$scale" ]; then
        log "--scale and --dilation: give one (a dilated agent's CPU and network are its type's / D)"
        exit 2
    fi
    case "$sandbox" in process | docker) ;; *) log "--sandbox is process or docker"; exit 2 ;; esac
    command -v python3 >/dev/null || die "python3 is needed (catalog, JSON)"
    if [ -n "$lambdas" ]; then
        [ -d "$lambdas" ] || die "--lambdas $lambdas is not a folder"
        lambdas="$(cd "$lambdas" && pwd -P)"
    fi
    [ -f "$catalog" ] || die "no catalog at $catalog"
    catalog="$(cd "$(dirname "$catalog")" && pwd -P)/$(basename "$catalog")"
    if [ -n "$plan_catalog" ]; then
        [ -f "$plan_catalog" ] || die "no catalog at $plan_catalog (--plan-catalog)"
        plan_catalog="$(cd "$(dirname "$plan_catalog")" && pwd -P)/$(basename "$plan_catalog")"
    else
        plan_catalog="$catalog"
    fi

    # VM types and what each agent container gets (scale or dilation).
    local cores plan rc=0
    cores="${SONIC_CLUSTER_CORES:-$(nproc)}"
    [[ "$cores" =~ ^[1-9][0-9]*$ ]] || { log "SONIC_CLUSTER_CORES takes a positive number"; exit 2; }
    plan="$(plan_agents "$catalog" "$agents" "$vms" "$scale" "$dilation" "$cores" "$store_delay" \
        "$memory" "$memory_mb" "$memory_delay")" || rc=$?
    [ "$rc" = 0 ] || exit "$rc"
    if [ "$dry_run" = 1 ]; then
        echo "$plan"
        return
    fi
    need
    local t0=$SECONDS

    # Images.
    local build_flags=(--"$profile")
    [ "$build" = 0 ] && build_flags+=(--no-build)
    [ "$memory" = 0 ] && build_flags+=(--no-redis)
    if [ "$sandbox" = docker ]; then
        # First: it builds sonic-agent too (always), so the agent image below gets that binary.
        log "building $LAMBDA_IMAGE (deploy/build-images.sh --$profile)"
        bash "$ROOT/deploy/build-images.sh" --"$profile" >&2
    fi
    bash "$ROOT/deploy/images/build.sh" "${build_flags[@]}"

    log "images ready in $((SECONDS - t0)) s"
    load_secrets

    local rows=() sum_vcpus
    mapfile -t rows < <(python3 -c '
import json, sys
p = json.loads(sys.argv[1])
for a in p["agents"]:
    s = a["store"] or {}
    print(a["name"], a["vm_type"], a["vcpus"], a["memory_mb"], a["cpus"], a["memory_limit_mb"],
          a["network_mbps"], a["store_delay_ms"], s.get("write_mbps", "-"),
          s.get("read_mbps", "-"), "capped" if a["cpus_capped"] else "-",
          a["cpu_period_us"] or "-", a["cpu_quota_us"] or "-", a["memory_delay_ms"])
' "$plan")
    # The memory tier: its link rate, --maxmemory (MB), where that came from, the capacity the
    # control plane plans with, where its figures came from (catalog or built-in); or nothing.
    local tier_rate="" tier_mb="" tier_mb_from="" tier_capacity="" tier_figures=""
    read -r tier_rate tier_mb tier_mb_from tier_capacity tier_figures < <(python3 -c '
import json, sys
m = json.loads(sys.argv[1])["memory_tier"]
print(*([m["network_mbps"], m["maxmemory_mb"], m["maxmemory_from"], m["capacity_mb"], m["catalog"]] if m else ["-"]))
' "$plan")
    [ "$tier_rate" = - ] && tier_rate=""
    agents="${#rows[@]}"
    local free_cores
    read -r sum_vcpus scale dilation free_cores < <(python3 -c '
import json, sys
p = json.loads(sys.argv[1])
print(p["vcpus"], p["scale"] if p["scale"] is not None else "-", p["dilation"] if p["dilation"] is not None else "-", p["free_cores"])
' "$plan")
    [ "$scale" = - ] && scale=""
    [ "$dilation" = - ] && dilation=""
    if [ -n "$dilation" ]; then
        log "dilation $dilation: $sum_vcpus vCPUs of $agents agents on $cores cores; each agent gets vCPUs / $dilation cores, its type's network rate / $dilation, its type's memory, the store $dilation times slower"
        if [ "$cores" -ge 2 ] && python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < 1 else 1)' "$free_cores"; then
            log "warning: the agents' quotas leave $free_cores of $cores cores to the store and the control plane (not dilated): they will take CPU the agents were given, and the figures depend on D (--dilation auto leaves one core)"
        fi
    else
        log "scale $scale: $cores cores for $sum_vcpus vCPUs of $agents agents"
    fi

    # TLS material.
    local scheme=http
    if [ "$TLS" = 1 ]; then
        scheme=https
        [ -f "$ROOT/deploy/certs.sh" ] || die "--tls needs deploy/certs.sh"
        local names=(--name "$CONTROL")
        for ((i = 1; i <= agents; i++)); do names+=(--name "sonic-agent-$i"); done
        bash "$ROOT/deploy/certs.sh" --out "$STATE/tls" "${names[@]}" >&2
        [ -f "$STATE/tls/ca.pem" ] || die "deploy/certs.sh wrote no $STATE/tls/ca.pem"
    fi

    local port
    port="$(choose_port)"
    if [ "$TLS" = 1 ]; then SERVER="https://localhost:$port"; else SERVER="http://127.0.0.1:$port"; fi

    ensure_network

    # A dilated cluster's containers get their CPU before this machine's other processes.
    local cg_args=()
    if [ -n "$dilation" ]; then
        local parent
        parent="$(prepare_cgroup)"
        [ -n "$parent" ] && cg_args=(--cgroup-parent "$parent")
    fi

    # The store.
    ensure_volume sonic-store-data
    # sonic-store-origin: the name agents' delay lines forward to (their sonic-store is the line).
    local store_args=(-v sonic-store-data:/data --label sonic.role=store --network-alias sonic-store-origin
        "${cg_args[@]}")
    if [ -n "${SONIC_CLUSTER_STORE_PORT:-}" ]; then
        store_args+=(-p "127.0.0.1:$SONIC_CLUSTER_STORE_PORT:8333")
    fi
    ensure "$STORE" "$STORE_IMAGE" "${store_args[@]}" --

    # The memory tier: Redis as a host of its own, nothing kept on disk, a full tier refusing
    # writes (noeviction: never a file dropped that a job still needs), its link shaped by
    # sonic-link as an agent's is (one class each way: no store traffic here).
    local memory_url="" memory_args=()
    if [ -n "$tier_rate" ]; then
        memory_url="redis://$REDIS:$REDIS_PORT"
        # sonic-redis-origin: the name agents' delay lines forward to (their sonic-redis is the line).
        local redis_args=(--label sonic.role=memory --label "sonic.network_mbps=$tier_rate"
            --label "sonic.maxmemory_mb=$tier_mb" --network-alias sonic-redis-origin
            "${cg_args[@]}"
            --cap-add NET_ADMIN -e "SONIC_LINK_MBPS=$tier_rate" -e SONIC_LINK_STORE_PORT=none)
        if [ -n "${SONIC_CLUSTER_MEMORY_PORT:-}" ]; then
            redis_args+=(-p "127.0.0.1:$SONIC_CLUSTER_MEMORY_PORT:$REDIS_PORT")
        fi
        log "$REDIS: the memory tier at $memory_url, ${tier_mb} MB (--maxmemory, from the ${tier_mb_from}), a link of $tier_rate Mbit/s each way (the ${tier_figures} tier's network_mbps${dilation:+ / $dilation})"
        if [ "$tier_mb" -lt "$tier_capacity" ]; then
            log "$REDIS: the control plane prices a tier of $tier_capacity MB (the ${tier_figures} one): a file the full tier refuses goes to the store (--memory-tier-mb MB gives it more)"
        fi
        ensure "$REDIS" "$REDIS_IMAGE" "${redis_args[@]}" -- \
            sonic-link -- redis-server --bind 0.0.0.0 --port "$REDIS_PORT" --protected-mode no \
            --save '' --appendonly no --dir /data \
            --maxmemory "${tier_mb}mb" --maxmemory-policy noeviction
        local answered="" until_t=$((SECONDS + 30))
        while :; do
            answered="$(docker exec "$REDIS" redis-cli -p "$REDIS_PORT" ping 2>/dev/null || true)"
            [ "$answered" = PONG ] && break
            if ! running "$REDIS"; then
                show_logs "$REDIS"
                die "$REDIS stopped while starting (logs above)"
            fi
            if ((SECONDS >= until_t)); then
                show_logs "$REDIS"
                die "$REDIS does not answer PING after 30 s (logs above)"
            fi
            sleep 0.2
        done
        log "$REDIS: answers PING"
        memory_args=(-e "SONIC_MEMORY_TIER=$memory_url")
    elif exists "$REDIS"; then
        log "$REDIS: removing (--no-memory-tier)"
        docker rm -f "$REDIS" >/dev/null
    fi

    # TLS settings of one daemon: the CA certificate and its own certificate and key, read-only
    # (not the folder: it holds the CA's key and every other daemon's key).
    tls_env() {
        if [ "$TLS" = 1 ]; then
            local f
            for f in ca.pem "$1.pem" "$1.key"; do
                [ -f "$STATE/tls/$f" ] || die "deploy/certs.sh wrote no $STATE/tls/$f"
                printf '%s\n' -v "$STATE/tls/$f:$TLS_IN/$f:ro"
            done
            printf '%s\n' -e "SONIC_TLS_CERT=$TLS_IN/$1.pem" -e "SONIC_TLS_KEY=$TLS_IN/$1.key" \
                -e "SONIC_CA_FILE=$TLS_IN/ca.pem"
        fi
    }
    local tls_args=()

    # The control plane.
    ensure_volume sonic-control-data
    mapfile -t tls_args < <(tls_env "$CONTROL")
    ensure "$CONTROL" "$CONTROL_IMAGE" \
        --label sonic.role=control "${cg_args[@]}" \
        -p "127.0.0.1:$port:$CONTROL_PORT" \
        -v sonic-control-data:/var/lib/sonic-control \
        -v "$plan_catalog:/etc/sonic/catalog.yaml:ro" \
        -e "SONIC_CONTROL_LISTEN=0.0.0.0:$CONTROL_PORT" \
        -e SONIC_CONTROL_DATA_DIR=/var/lib/sonic-control \
        -e "SONIC_TOKEN=$API_TOKEN" \
        -e "SONIC_JOIN_TOKEN=$JOIN_TOKEN" \
        -e SONIC_CATALOG=/etc/sonic/catalog.yaml \
        -e "SONIC_MAX_BODY=${SONIC_CLUSTER_MAX_BODY:-1GiB}" \
        -e "SONIC_S3_ENDPOINT=http://$STORE:8333" \
        -e SONIC_S3_BUCKET=sonic \
        -e SONIC_S3_ACCESS_KEY=sonic \
        -e SONIC_S3_SECRET_KEY=sonicsecret \
        -e "SONIC_S3_OUTAGE_WINDOW_MS=${SONIC_CLUSTER_STORE_OUTAGE_MS:-30000}" \
        -e "SONIC_CONTROL_DILATION=${dilation:-1}" \
        -e "RUST_LOG=${SONIC_CLUSTER_LOG:-info}" -e NO_COLOR=1 \
        "${memory_args[@]}" "${tls_args[@]}" --

    # The agents. Until the daemons speak the join protocol, an agent needs the API token and the
    # file key instead of the join token (the image says which: label sonic.joins).
    local joins
    joins="$(docker image inspect -f '{{index .Config.Labels "sonic.joins"}}' "$AGENT_IMAGE")"
    local legacy=()
    if [ "$joins" != 1 ]; then
        legacy=(-e "SONIC_AGENT_TOKEN=$API_TOKEN" -e "SONIC_FILE_KEY=$FILE_KEY")
        [ -n "$memory_url" ] && legacy+=(-e "SONIC_AGENT_MEMORY_TIER=$memory_url")
        log "this sonic-agent does not take SONIC_JOIN_TOKEN yet: agents get the API token and a file key"
    fi
    local n name vm vcpus mem cpus mem_limit rate data_dir args cmd delay wmbps rmbps capped
    local period quota cpu_args mdelay
    for ((n = 1; n <= agents; n++)); do
        read -r name vm vcpus mem cpus mem_limit rate delay wmbps rmbps capped period quota mdelay <<<"${rows[n - 1]}"
        cpu_args=(--cpus "$cpus")
        if [ "$period" != - ]; then
            # Dilated: the same share over a short period (plan_agents says why).
            cpu_args=(--cpu-period "$period" --cpu-quota "$quota")
        fi
        if [ "$capped" = capped ]; then
            log "$name: $vcpus vCPUs x ${scale:-1/$dilation} is more than the $cores cores here: --cpus $cpus"
        fi
        # --init: an init as pid 1 reaps what lambdas leave behind (the agent is not an init).
        args=(--init --label sonic.role=agent --label "sonic.vm_type=$vm" --label "sonic.vcpus=$vcpus"
            --label "sonic.memory_mb=$mem" --label "sonic.network_mbps=$rate"
            --label "sonic.dilation=${dilation:-}"
            # The tier the control plane gives it when it joins: an agent is made again when
            # that changes (it joined without it, or with another).
            --label "sonic.memory_tier=$memory_url"
            "${cpu_args[@]}" "${cg_args[@]}" --memory "${mem_limit}m" --memory-swap "${mem_limit}m"
            -e "SONIC_AGENT_ID=$name"
            -e "SONIC_AGENT_LISTEN=0.0.0.0:$AGENT_PORT"
            -e "SONIC_AGENT_ADVERTISE_URL=$scheme://$name:$AGENT_PORT"
            -e "SONIC_AGENT_VM_TYPE=$vm"
            -e "SONIC_AGENT_VCPUS=$vcpus"
            -e "SONIC_AGENT_MEMORY_MB=$mem"
            -e "SONIC_AGENT_NETWORK_MBPS=$rate"
            # The kernel shapes the link (sonic-link); the agent declares the rate only.
            --cap-add NET_ADMIN -e "SONIC_LINK_MBPS=$rate" -e SONIC_AGENT_LIMIT_NETWORK=false
            -e "SONIC_CONTROL_URL=$scheme://$CONTROL:$CONTROL_PORT"
            -e "SONIC_JOIN_TOKEN=$JOIN_TOKEN"
            -e "SONIC_AGENT_SANDBOX=$sandbox"
            -e "RUST_LOG=${SONIC_CLUSTER_LOG:-info}" -e NO_COLOR=1)
        if [ -n "$dilation" ]; then
            # The VM's connection to the store, $dilation times slower, shaped by the kernel.
            args+=(-e "SONIC_LINK_STORE_WRITE_MBPS=$wmbps" -e "SONIC_LINK_STORE_READ_MBPS=$rmbps")
        fi
        if python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$delay"; then
            # The store's name leads to the delay line (sonic-link starts it on 127.0.0.1), which
            # forwards to the store's other name.
            args+=(-e "SONIC_LINK_STORE_DELAY_MS=$delay" --add-host "$STORE:127.0.0.1")
        fi
        if [ -n "$memory_url" ] && python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$mdelay"; then
            # The same for the memory tier: its name leads to a second delay line, which
            # forwards to the tier's other name (the control plane reaches the tier directly).
            args+=(-e "SONIC_LINK_MEMORY_DELAY_MS=$mdelay" -e "SONIC_LINK_MEMORY_PORT=$REDIS_PORT"
                --add-host "$REDIS:127.0.0.1")
        fi
        args+=("${legacy[@]}")
        if [ "$sandbox" = docker ]; then
            # Sibling containers bind-mount host paths: the data folder has the same path inside.
            # --pid host: the Docker sandbox tells its own lambda containers from those of a gone
            # agent by the owner's pid and start time, which must be unique across the agents
            # sharing this engine (in separate pid namespaces they would all have the same small pids).
            data_dir="$STATE/agent-$n"
            mkdir -p "$data_dir"
            args+=(-v /var/run/docker.sock:/var/run/docker.sock -v "$data_dir:$data_dir"
                --pid host -e "SONIC_AGENT_DATA_DIR=$data_dir")
        else
            data_dir=/var/lib/sonic-agent
            ensure_volume "$name-data"
            args+=(-v "$name-data:$data_dir" -e "SONIC_AGENT_DATA_DIR=$data_dir")
        fi
        cmd=(sonic-link -- sonic-agent)
        if [ -n "$lambdas" ]; then
            args+=(-v "$lambdas:$lambdas:ro")
            cmd+=(--bin-dir "$lambdas")
        fi
        # The image's lambdas, sonic-time among them: without it the process sandbox forks the
        # agent for every lambda, and a lambda's peak memory starts from the agent's size.
        cmd+=(--bin-dir /usr/local/bin)
        mapfile -t tls_args < <(tls_env "$name")
        args+=("${tls_args[@]}")
        ensure "$name" "$AGENT_IMAGE" "${args[@]}" -- "${cmd[@]}"
    done

    # Agents beyond N from an earlier, larger cluster.
    local extra
    for extra in $(docker ps -a --filter 'name=^/sonic-agent-[0-9]+$' --format '{{.Names}}'); do
        if [ "${extra#sonic-agent-}" -gt "$agents" ]; then
            log "$extra: removing (beyond --agents $agents)"
            docker rm -f "$extra" >/dev/null
            docker volume rm "$extra-data" >/dev/null 2>&1 || true
        fi
    done

    python3 - "$STATE_FILE" "$port" "$SERVER" "$agents" "$sandbox" "$scale" "$TLS" "$profile" "$lambdas" "$catalog" "$dilation" "$vms" "$plan_catalog" "$memory_url" <<'PY'
import json, sys
path, port, server, agents, sandbox, scale, tls, profile, lambdas, catalog, dilation, vms, plan_catalog, memory_tier = sys.argv[1:]
json.dump({"port": int(port), "server": server, "agents": int(agents), "sandbox": sandbox,
           "scale": float(scale) if scale else None, "dilation": float(dilation) if dilation else None,
           "vms": vms or None, "tls": tls == "1", "profile": profile,
           "lambdas": lambdas or None, "catalog": catalog, "plan_catalog": plan_catalog,
           "memory_tier": memory_tier or None},
          open(path, "w"), indent=2)
PY

    # Wait until every agent has joined.
    local timeout="${SONIC_CLUSTER_TIMEOUT:-180}" deadline joined missing c t1=$SECONDS
    deadline=$((SECONDS + timeout))
    log "waiting for $agents agents to join $SERVER (at most $timeout s)"
    while :; do
        joined="$(joined_agents)"
        missing=()
        for ((n = 1; n <= agents; n++)); do
            grep -qx "sonic-agent-$n" <<<"$joined" || missing+=("sonic-agent-$n")
        done
        [ "${#missing[@]}" = 0 ] && break
        for c in "$STORE" ${memory_url:+"$REDIS"} "$CONTROL" "${missing[@]}"; do
            if ! running "$c"; then
                show_logs "$c"
                die "$c stopped while the cluster was starting (logs above)"
            fi
        done
        if ((SECONDS >= deadline)); then
            if ! control_get /v1/agents >/dev/null 2>&1; then
                log "the control plane does not answer on $SERVER"
                show_logs "$CONTROL"
            fi
            for c in "${missing[@]}"; do show_logs "$c"; done
            die "timed out after $timeout s: not joined: ${missing[*]} (logs above)"
        fi
        sleep 0.5
    done
    log "all $agents agents joined after $((SECONDS - t1)) s of waiting ($((SECONDS - t0)) s in all)"
    # Cluster images replaced by this run's build and no longer used by a container.
    docker image prune -f --filter label=sonic.cluster.image >/dev/null 2>&1 || true

    save_context
    echo "$SERVER"
}

# --- status --------------------------------------------------------------------------------------

cmd_status() {
    local out=table
    while [ "$#" -gt 0 ]; do
        case "$1" in
            -o) out="${2:-}"; shift 2 ;;
            -o=* | --output=*) out="${1#*=}"; shift ;;
            --output) out="${2:-}"; shift 2 ;;
            -h | --help) usage 0 ;;
            *) log "status: unknown argument $1"; usage 2 ;;
        esac
    done
    case "$out" in table | json) ;; *) log "-o is table or json"; exit 2 ;; esac
    need
    SERVER="$(state_get server)"
    TLS=0
    [ "$(state_get tls)" = true ] && TLS=1
    local joined="" answers=false
    if [ -n "$SERVER" ] && [ -s "$SECRETS" ] && running "$CONTROL"; then
        load_secrets
        if control_get /v1/agents >/dev/null 2>&1; then
            answers=true
            joined="$(joined_agents | tr '\n' ' ')"
        fi
    fi
    local ids=()
    mapfile -t ids < <(cluster_containers)
    local rows=""
    if [ "${#ids[@]}" -gt 0 ]; then
        rows="$(docker inspect -f '{{.Name}}	{{.State.Status}}	{{with index .NetworkSettings.Networks "sonic"}}{{.IPAddress}}{{end}}	{{index .Config.Labels "sonic.role"}}	{{index .Config.Labels "sonic.vm_type"}}	{{index .Config.Labels "sonic.vcpus"}}	{{index .Config.Labels "sonic.memory_mb"}}	{{index .Config.Labels "sonic.network_mbps"}}	{{.HostConfig.NanoCpus}}	{{.HostConfig.Memory}}	{{index .Config.Labels "sonic.dilation"}}	{{.HostConfig.CpuQuota}}	{{.HostConfig.CpuPeriod}}	{{index .Config.Labels "sonic.maxmemory_mb"}}' "${ids[@]}")"
    fi
    local network=false
    docker network inspect "$NET" >/dev/null 2>&1 && network=true
    ROWS="$rows" python3 - "$out" "$SERVER" "$answers" "$joined" "$network" "$(state_get sandbox)" "$(state_get scale)" "$(state_get dilation)" "$(state_get memory_tier)" <<'PY'
import os
import json, sys
out, server, answers, joined, network, sandbox, scale, dilation, memory_tier = sys.argv[1:10]
joined = set(joined.split())
rows = []
for line in os.environ.get("ROWS", "").splitlines():
    if not line.strip():
        continue
    fields = [("" if f == "<no value>" else f) for f in line.split("\t")]
    fields += [""] * (14 - len(fields))
    name, state, addr, role, vm, vcpus, mem, mbps, nano, memlim, dil, cquota, cperiod, maxmem = fields[:14]
    if not (nano and int(nano)) and cquota and int(cquota) > 0 and cperiod and int(cperiod) > 0:
        # A dilated agent's quota over its own period (--cpu-period, --cpu-quota).
        nano = str(int(cquota) * 10**9 // int(cperiod))
    name = name.lstrip("/")
    if not role:
        role = {"sonic-store": "store", "sonic-control": "control", "sonic-redis": "memory"}.get(name, "agent")
    r = {"name": name, "role": role, "state": state, "address": addr or None,
         "vm_type": vm or None,
         "cpus": round(int(nano) / 1e9, 3) if nano and int(nano) else None,
         "memory_mb": int(memlim) // (1024 * 1024) if memlim and int(memlim) else None}
    if role == "agent":
        r["vcpus"] = int(vcpus) if vcpus else None
        r["declared_memory_mb"] = int(mem) if mem else None
        r["network_mbps"] = float(mbps) if mbps else None
        r["dilation"] = float(dil) if dil else None
        r["joined"] = (name in joined) if answers == "true" else None
    if role == "memory":
        # The memory tier: its shaped link and its --maxmemory.
        r["network_mbps"] = float(mbps) if mbps else None
        r["maxmemory_mb"] = int(maxmem) if maxmem else None
    rows.append(r)
order = {"store": 0, "memory": 1, "control": 2, "agent": 3}
def key(r):
    n = r["name"].rsplit("-", 1)[-1]
    return (order.get(r["role"], 3), int(n) if n.isdigit() else 0, r["name"])
rows.sort(key=key)
doc = {"network": "sonic" if network == "true" else None, "server": server or None,
       "control_answers": answers == "true", "sandbox": sandbox or None,
       "scale": float(scale) if scale else None,
       "dilation": float(dilation) if dilation else None,
       "memory_tier": memory_tier or None, "containers": rows}
if out == "json":
    print(json.dumps(doc, indent=2))
    sys.exit(0)
if not rows:
    print("no cluster (bash deploy/cluster.sh up starts one)")
    sys.exit(0)
def fmt(v):
    return "-" if v is None else ("yes" if v is True else "no" if v is False else str(v))
head = ["CONTAINER", "STATE", "ADDRESS", "VM TYPE", "CPUS", "MEMORY", "NET MBPS", "JOINED"]
table = [head] + [[r["name"], r["state"], fmt(r["address"]), fmt(r["vm_type"]), fmt(r["cpus"]),
                   fmt(r["memory_mb"] or r.get("maxmemory_mb")) + ("M" if r["memory_mb"] or r.get("maxmemory_mb") else ""),
                   fmt(r.get("network_mbps")), fmt(r.get("joined"))] for r in rows]
w = [max(len(row[i]) for row in table) for i in range(len(head))]
for row in table:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip())
print(f"server: {server or '-'} ({'answers' if answers == 'true' else 'not answering'}), network sonic: {'yes' if network == 'true' else 'no'}")
print(f"memory tier: {memory_tier or 'none'}" + ("" if not memory_tier else " (the MEMORY of sonic-redis is its --maxmemory)"))
if dilation:
    print(f"dilation: {float(dilation):g} (agents run {float(dilation):g} times slower than their VMs: divide measured times by it)")
elif scale:
    print(f"scale: {float(scale):g} (not dilated)")
PY
}

# --- down ----------------------------------------------------------------------------------------

cmd_down() {
    [ "$#" = 0 ] || { log "down takes no arguments"; exit 2; }
    command -v docker >/dev/null || die "docker is not installed"
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "the Docker engine does not answer"
    local ids=() c
    mapfile -t ids < <(cluster_containers)
    if [ "${#ids[@]}" -gt 0 ]; then
        log "removing ${#ids[@]} containers"
        docker rm -f "${ids[@]}" >/dev/null
    fi
    # Lambda containers the agents of --sandbox docker started (their folder is under ours).
    local lambda_ids=()
    while read -r c dir; do
        [ -n "$c" ] || continue
        case "$dir" in "$STATE"/agent-*) lambda_ids+=("$c") ;; esac
    done < <(docker ps -a --filter label=sonic.sandbox=docker --format '{{.ID}} {{.Label "sonic.dir"}}')
    if [ "${#lambda_ids[@]}" -gt 0 ]; then
        log "removing ${#lambda_ids[@]} lambda containers of the agents"
        docker rm -f "${lambda_ids[@]}" >/dev/null
    fi
    if docker network inspect "$NET" >/dev/null 2>&1; then
        log "removing network $NET"
        docker network rm "$NET" >/dev/null ||
            die "network $NET is still used by: $(docker network inspect -f '{{range .Containers}}{{.Name}} {{end}}' "$NET")"
    fi
    local vols=()
    mapfile -t vols < <({
        docker volume ls -q --filter "label=$LABEL"
        docker volume ls -q | grep -Ex 'sonic-(store|control|agent-[0-9]+)-data' || true
    } | sort -u)
    if [ "${#vols[@]}" -gt 0 ]; then
        log "removing volumes: ${vols[*]}"
        docker volume rm "${vols[@]}" >/dev/null
    fi
    local dirs=()
    mapfile -t dirs < <(compgen -G "$STATE/agent-*" || true)
    if [ "${#dirs[@]}" -gt 0 ]; then
        # Lambda containers write as root there: without root, a container removes what is left.
        if ! rm -rf "${dirs[@]}" 2>/dev/null; then
            docker run --rm -v "$STATE:/cluster" sonic-base:bookworm \
                bash -c 'rm -rf /cluster/agent-*' >/dev/null 2>&1 || log "could not remove all of ${dirs[*]}"
        fi
    fi
    remove_cgroup
    rm -f "$STATE_FILE"
    log "down"
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    status) shift; cmd_status "$@" ;;
    down) shift; cmd_down "$@" ;;
    -h | --help | help) usage 0 ;;
    *) usage 2 ;;
esac
