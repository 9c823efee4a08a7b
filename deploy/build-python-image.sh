#!/usr/bin/env bash
# Builds `sonic-python:latest`, the image the Docker sandbox runs Python handler stages in
# (docs/python.md), with no registry at all: Debian's packages and a local build only.
#
#   bash deploy/build-python-image.sh            # sonic-launcher from a release build
#   bash deploy/build-python-image.sh --debug    # from a debug build (what the tests use)
#   bash deploy/build-python-image.sh --base-only   # step 1 only (no cargo)
#
# Two steps, each cached:
# 1. `sonic-python:bookworm-base`: a Debian bookworm root filesystem made by
#    `debootstrap --variant=minbase` with python3, python3-venv and python3-pip (pip 23, which
#    can install into a venv made without pip: `pip --python`), trimmed of docs and apt lists,
#    loaded with `docker import`. Made once: it is not rebuilt while an image of that tag carries
#    the same recipe (label sonic.recipe). The mirror is the host's own apt mirror (read from
#    /etc/apt/sources.list[.d]), or SONIC_DEBIAN_MIRROR.
# 2. `sonic-python:latest`: the base plus `sonic-launcher` in /usr/local/bin (the Docker sandbox
#    keeps a container warm with it and has it start each run), added with `docker create`,
#    `docker cp` and `docker commit`; replaced only when the base or the launcher changed
#    (label sonic.content).
#
# Needs root (debootstrap), debootstrap (apt-get install debootstrap), Docker and cargo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SONIC_PYTHON_IMAGE:-sonic-python:latest}"
BASE="${SONIC_PYTHON_BASE_IMAGE:-sonic-python:bookworm-base}"
SUITE=bookworm
PACKAGES=python3,python3-venv,python3-pip,ca-certificates
PROFILE=release
BASE_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --debug) PROFILE=debug ;;
        --release) PROFILE=release ;;
        --base-only) BASE_ONLY=1 ;;
        -h | --help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build-python-image: unknown argument $arg (use --debug or --release)" >&2; exit 2 ;;
    esac
done

log() { echo "build-python-image: $*" >&2; }

command -v docker >/dev/null || { log "docker is not installed"; exit 1; }
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    { log "the Docker engine does not answer: start it (e.g. 'service docker start')"; exit 1; }

# The recipe of the base: what goes into it. Change it and the base is made again.
RECIPE="$(printf '%s\n' "v1" "$SUITE" "$PACKAGES" | sha256sum | cut -c1-16)"
current="$(docker image inspect -f '{{index .Config.Labels "sonic.recipe"}}' "$BASE" 2>/dev/null || true)"
if [ "$current" = "$RECIPE" ]; then
    log "$BASE is up to date (recipe $RECIPE)"
else
    [ "$(id -u)" = 0 ] || { log "making $BASE needs root (debootstrap)"; exit 1; }
    if ! command -v debootstrap >/dev/null; then
        if command -v apt-get >/dev/null; then
            log "installing debootstrap"
            apt-get install -y -qq debootstrap >/dev/null ||
                { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
        else
            log "debootstrap is missing (apt-get install debootstrap)"; exit 1
        fi
    fi
    mirror="${SONIC_DEBIAN_MIRROR:-}"
    if [ -z "$mirror" ]; then
        # The first Debian mirror the host's apt uses (deb822 `URIs:` or one-line `deb URI`).
        mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
            awk '/^URIs:/ && $2 !~ /security/ { print $2; exit }')"
    fi
    if [ -z "$mirror" ]; then
        mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" && $2 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }')"
    fi
    [ -n "$mirror" ] || { log "no Debian mirror found in /etc/apt: set SONIC_DEBIAN_MIRROR"; exit 1; }
    STAGE="$(mktemp -d "${TMPDIR:-/tmp}/sonic-python.XXXXXX")"
    trap 'rm -rf "$STAGE"' EXIT
    log "debootstrap $SUITE ($PACKAGES) into $STAGE/rootfs"
    t0=$SECONDS
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$STAGE/rootfs" "$mirror" \
        >"$STAGE/debootstrap.log" 2>&1 || {
        tail -n 20 "$STAGE/debootstrap.log" >&2
        log "debootstrap failed"
        exit 1
    }
    # Not needed to run Python: documentation, manuals, locales, apt's lists and caches.
    rm -rf "$STAGE/rootfs"/usr/share/{doc,man,info,locale}/* "$STAGE/rootfs"/var/cache/apt/* \
        "$STAGE/rootfs"/var/lib/apt/lists/* "$STAGE/rootfs"/var/log/*
    mkdir -p "$STAGE/rootfs/sonic"
    log "importing $BASE (debootstrap took $((SECONDS - t0)) s)"
    old_id="$(docker image inspect -f '{{.Id}}' "$BASE" 2>/dev/null || true)"
    tar -C "$STAGE/rootfs" --numeric-owner -cf - . |
        docker import \
            --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'WORKDIR /sonic' \
            --change 'CMD ["python3"]' \
            --change "LABEL sonic.recipe=$RECIPE" \
            - "$BASE" >/dev/null
    if [ -n "$old_id" ]; then docker image rm "$old_id" >/dev/null 2>&1 || true; fi
    rm -rf "$STAGE"
    trap - EXIT
fi

[ "$BASE_ONLY" = 1 ] && exit 0

# The launcher, from this workspace.
cd "$ROOT"
CARGO_FLAGS=()
[ "$PROFILE" = release ] && CARGO_FLAGS+=(--release)
log "building sonic-launcher ($PROFILE)"
cargo build "${CARGO_FLAGS[@]}" -p sonic-lambdas --bin sonic-launcher
TARGET_DIR="$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
LAUNCHER="$TARGET_DIR/$PROFILE/sonic-launcher"
[ -x "$LAUNCHER" ] || { log "missing $LAUNCHER after the build"; exit 1; }
# The launcher links only against glibc, which the base (bookworm) has.
STRIPPED="$(mktemp "${TMPDIR:-/tmp}/sonic-launcher.XXXXXX")"
trap 'rm -f "$STRIPPED"' EXIT
cp "$LAUNCHER" "$STRIPPED"
if command -v strip >/dev/null; then strip --strip-debug "$STRIPPED"; fi
chmod 755 "$STRIPPED"

base_id="$(docker image inspect -f '{{.Id}}' "$BASE")"
hash="$( (echo "$base_id"; sha256sum <"$STRIPPED") | sha256sum | cut -c1-16)"
current="$(docker image inspect -f '{{index .Config.Labels "sonic.content"}}' "$IMAGE" 2>/dev/null || true)"
if [ "$current" = "$hash" ]; then
    log "$IMAGE is up to date (content $hash)"
else
    old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
    log "making $IMAGE (content $hash)"
    cid="$(docker create "$BASE" true)"
    docker cp "$STRIPPED" "$cid:/usr/local/bin/sonic-launcher" >/dev/null
    docker commit \
        --change 'CMD ["sonic-launcher"]' \
        --change "LABEL sonic.content=$hash" \
        "$cid" "$IMAGE" >/dev/null
    docker rm "$cid" >/dev/null
    if [ -n "$old_id" ]; then docker image rm "$old_id" >/dev/null 2>&1 || true; fi
fi
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
echo "$IMAGE: $((size / 1024 / 1024)) MiB ($size bytes), $(docker run --rm --network none "$IMAGE" python3 --version 2>&1)"
