#!/usr/bin/env bash
# Builds the lambda binaries and the `sonic-lambdas:latest` image, with no registry at all.
#
#   bash deploy/build-images.sh            # release binaries
#   bash deploy/build-images.sh --debug    # debug binaries (faster to build; what the tests use)
#
# The image is `FROM scratch`-like: a root filesystem made here from every binary of the
# `sonic-lambdas` package (into /usr/local/bin, on PATH), the shared libraries `ldd` lists for
# them, the dynamic loader, and an empty /tmp; it is loaded with `docker import`, so nothing is
# pulled and BuildKit is not involved. Containers run `sonic-launcher` by default: the Docker sandbox
# keeps a container warm with it and has it start each lambda (see sonic_lambda::launcher).
#
# Idempotent: the image carries a hash of its content (label sonic.content) and is not replaced
# when that hash has not changed. Prints the image size at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SONIC_LAMBDAS_IMAGE:-sonic-lambdas:latest}"
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
    if ! cargo build "${CARGO_FLAGS[@]}" -p sonic-agent --bins; then
        log "WARNING: sonic-agent did not build (see above); the image is built without waiting for it"
    fi
else
    log "sonic-agent has no binary yet: skipped"
fi

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/sonic-image.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
ROOTFS="$STAGE/rootfs"
mkdir -p "$ROOTFS/usr/local/bin" "$ROOTFS/tmp" "$ROOTFS/sonic"
chmod 1777 "$ROOTFS/tmp"

# Copies a file to the same path inside the root filesystem, following symlinks.
add_file() {
    local src="$1"
    [ -e "$ROOTFS$src" ] && return 0
    mkdir -p "$ROOTFS$(dirname "$src")"
    cp -L "$src" "$ROOTFS$src"
}

for bin in "${LAMBDA_BINS[@]}"; do
    src="$TARGET_DIR/$PROFILE/$bin"
    [ -x "$src" ] || { log "missing $src after the build"; exit 1; }
    cp "$src" "$ROOTFS/usr/local/bin/$bin"
    # Debug info is not needed to run; it makes the image several times larger.
    if command -v strip >/dev/null; then strip --strip-debug "$ROOTFS/usr/local/bin/$bin"; fi
    # ldd lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and
    # "/lib64/ld-linux-x86-64.so.2 (0x...)" (the loader); vdso has no file.
    while read -r lib; do
        add_file "$lib"
    done < <(ldd "$src" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }')
done

# The content hash: paths, modes and bytes, in a stable order.
HASH="$(cd "$ROOTFS" && find . -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-16)"
CURRENT="$(docker image inspect -f '{{index .Config.Labels "sonic.content"}}' "$IMAGE" 2>/dev/null || true)"
if [ "$CURRENT" = "$HASH" ]; then
    log "$IMAGE is up to date (content $HASH)"
else
    OLD_ID="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
    log "importing $IMAGE (content $HASH)"
    tar -C "$ROOTFS" --numeric-owner --owner=0 --group=0 -cf - . |
        docker import \
            --change 'ENV PATH=/usr/local/bin' \
            --change 'WORKDIR /sonic' \
            --change 'CMD ["sonic-launcher"]' \
            --change "LABEL sonic.content=$HASH" \
            - "$IMAGE" >/dev/null
    # The previous image is now untagged; remove it unless a container still uses it.
    if [ -n "$OLD_ID" ]; then docker image rm "$OLD_ID" >/dev/null 2>&1 || true; fi
fi

SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
echo "$IMAGE: $((SIZE / 1024 / 1024)) MiB ($SIZE bytes), binaries: ${LAMBDA_BINS[*]}"
