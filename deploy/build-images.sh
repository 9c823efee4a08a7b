#!/usr/bin/env bash
# Builds the lambda binaries and the `sonic-lambdas:latest` image, and the `sonic-agent:latest`
# image, with no registry at all.
#
#   bash deploy/build-images.sh            # release binaries
#   bash deploy/build-images.sh --debug    # debug binaries (faster to build; what the tests use)
#
# Each image is `FROM scratch`-like: a root filesystem made here from every binary of the
# `sonic-lambdas` package (into /usr/local/bin, on PATH), the shared libraries `ldd` lists for
# them, the dynamic loader, and an empty /tmp; it is loaded with `docker import`, so nothing is
# pulled and BuildKit is not involved. Containers run `sonic-launcher` by default: the Docker sandbox
# keeps a container warm with it and has it start each lambda (see sonic_lambda::launcher).
#
# Idempotent: the image carries a hash of its content (label sonic.content) and is not replaced
# when that hash has not changed. Prints the image sizes at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SONIC_LAMBDAS_IMAGE:-sonic-lambdas:latest}"
AGENT_IMAGE="${SONIC_AGENT_IMAGE:-sonic-agent:latest}"
AGENT_BUILT=0
PROFILE=release
for arg in "$@"; do
    case "$arg" in
        --debug) PROFILE=debug ;;
        --release) PROFILE=release ;;
        -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build-images: unknown argument $arg (use --debug or --release)" >&2; exit 2 ;;
    esac
done

log() { echo "build-images: $*" >&2; }

command -v docker >/dev/null || { log "docker is not installed"; exit 1; }
command -v jq >/dev/null || { log "jq is needed to read cargo metadata (apt-get install jq)"; exit 1; }
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    { log "the Docker engine does not answer: start it (e.g. 'service docker start')"; exit 1; }

cd "$ROOT"
CARGO_FLAGS=()
[ "$PROFILE" = release ] && CARGO_FLAGS+=(--release)

METADATA="$(cargo metadata --no-deps --format-version 1)"
TARGET_DIR="$(jq -r '.target_directory' <<<"$METADATA")"
bins_of() {
    jq -r --arg p "$1" \
        '.packages[] | select(.name == $p) | .targets[] | select(.kind | index("bin")) | .name' \
        <<<"$METADATA"
}

mapfile -t LAMBDA_BINS < <(bins_of sonic-lambdas)
[ "${#LAMBDA_BINS[@]}" -gt 0 ] || { log "the sonic-lambdas package has no binaries"; exit 1; }
log "building sonic-lambdas ($PROFILE): ${LAMBDA_BINS[*]}"
cargo build "${CARGO_FLAGS[@]}" -p sonic-lambdas --bins

if [ -n "$(bins_of sonic-agent)" ]; then
    log "building sonic-agent ($PROFILE)"
    # The agent runs on the host, not in the image: a failure here must not block the image.
    if cargo build "${CARGO_FLAGS[@]}" -p sonic-agent --bins; then
        AGENT_BUILT=1
    else
        log "WARNING: sonic-agent did not build (see above); only the lambda image is built"
    fi
else
    log "sonic-agent has no binary yet: skipped"
fi

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/sonic-image.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT

# make_image IMAGE CMD BIN...: a root filesystem with the binaries in /usr/local/bin, the libraries
# ldd lists for them and the loader, imported as IMAGE with CMD as its default command.
make_image() {
    local image="$1" cmd="$2"
    shift 2
    local rootfs="$STAGE/$(tr -c 'a-zA-Z0-9' '_' <<<"$image")"
    rm -rf "$rootfs"
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/sonic"
    chmod 1777 "$rootfs/tmp"
    local bin src lib
    for bin in "$@"; do
        src="$TARGET_DIR/$PROFILE/$bin"
        [ -x "$src" ] || { log "missing $src after the build"; exit 1; }
        cp "$src" "$rootfs/usr/local/bin/$bin"
        # Debug info is not needed to run; it makes the image several times larger.
        if command -v strip >/dev/null; then strip --strip-debug "$rootfs/usr/local/bin/$bin"; fi
        # ldd lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and
        # "/lib64/ld-linux-x86-64.so.2 (0x...)" (the loader); vdso has no file.
        while read -r lib; do
            if [ ! -e "$rootfs$lib" ]; then
                mkdir -p "$rootfs$(dirname "$lib")"
                cp -L "$lib" "$rootfs$lib"
            fi
        done < <(ldd "$src" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }')
    done

    # The agent speaks HTTPS (the control plane over TLS, S3): its HTTP client needs the CA
    # certificates, or it does not start ("http client: builder error").
    if [ "$image" = "$AGENT_IMAGE" ]; then
        local bundle=/etc/ssl/certs/ca-certificates.crt
        [ -f "$bundle" ] || { log "missing $bundle (apt-get install ca-certificates)"; exit 1; }
        mkdir -p "$rootfs/etc/ssl/certs"
        cp -L "$bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    fi

    # The content hash: paths, modes and bytes, in a stable order.
    local hash current old_id size
    hash="$(cd "$rootfs" && find . -type f -print0 | LC_ALL=C sort -z |
        xargs -0 sha256sum | sha256sum | cut -c1-16)"
    current="$(docker image inspect -f '{{index .Config.Labels "sonic.content"}}' "$image" 2>/dev/null || true)"
    if [ "$current" = "$hash" ]; then
        log "$image is up to date (content $hash)"
    else
        old_id="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
        log "importing $image (content $hash)"
        tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf - . |
            docker import \
                --change 'ENV PATH=/usr/local/bin' \
                --change 'WORKDIR /sonic' \
                --change "CMD [\"$cmd\"]" \
                --change "LABEL sonic.content=$hash" \
                - "$image" >/dev/null
        # The previous image is now untagged; remove it unless a container still uses it.
        if [ -n "$old_id" ]; then docker image rm "$old_id" >/dev/null 2>&1 || true; fi
    fi
    size="$(docker image inspect -f '{{.Size}}' "$image")"
    echo "$image: $((size / 1024 / 1024)) MiB ($size bytes), binaries: $*"
}

make_image "$IMAGE" sonic-launcher "${LAMBDA_BINS[@]}"

# The agent image: the agent alone. Run it with the Docker socket and its data directory mounted
# (docs/agent.md), or as a plain process on the host.
if [ "$AGENT_BUILT" = 1 ]; then
    make_image "$AGENT_IMAGE" sonic-agent sonic-agent
fi
