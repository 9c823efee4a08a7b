#!/usr/bin/env bash
# A minimal Debian root filesystem (bash, coreutils, findutils, python3, CA certificates, iproute2) as a
# tarball, made once with debootstrap and cached under .ci-data/images/ (gitignored). Prints the
# tarball's path on stdout.
#
#   bash deploy/images/debian-rootfs.sh          # make it unless cached
#   bash deploy/images/debian-rootfs.sh --force  # make it again
#
# The Debian mirror is the one this machine's apt uses (read from /etc/apt/sources.list.d/*.sources
# or /etc/apt/sources.list at run time); SONIC_DEBIAN_MIRROR overrides it. debootstrap is installed
# with apt-get when missing (needs root). Runs as root: debootstrap needs it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SUITE="${SONIC_DEBIAN_SUITE:-bookworm}"
INCLUDE="python3,ca-certificates,iproute2"
CACHE="$ROOT/.ci-data/images"
TARBALL="$CACHE/debian-$SUITE-minbase-$(tr ',' '-' <<<"$INCLUDE").tar"
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h | --help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "debian-rootfs: unknown argument $arg" >&2; exit 2 ;;
    esac
done

log() { echo "debian-rootfs: $*" >&2; }

if [ "$FORCE" = 0 ] && [ -s "$TARBALL" ]; then
    echo "$TARBALL"
    exit 0
fi

# The first plain Debian archive URI apt is configured with (not the security archive).
mirror() {
    if [ -n "${SONIC_DEBIAN_MIRROR:-}" ]; then
        echo "$SONIC_DEBIAN_MIRROR"
        return
    fi
    local uri=""
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822 stanzas: take URIs of a stanza whose Suites name the plain suite.
        uri="$(awk -v suite="$SUITE" '
            BEGIN { RS = ""; FS = "\n" }
            {
                u = ""; ok = 0; deb = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
                    if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
                    if ($i ~ /^Suites:/) {
                        n = split($i, s, /[ \t]+/)
                        for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1
                    }
                }
                if (ok && deb && u != "") { print u; exit }
            }' "$f")"
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        uri="$(awk -v suite="$SUITE" '$1 == "deb" {
                for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1) == suite) { print $i; exit } break }
            }' /etc/apt/sources.list)"
    fi
    [ -n "$uri" ] || { log "no Debian mirror for $SUITE in /etc/apt sources: set SONIC_DEBIAN_MIRROR"; exit 1; }
    echo "$uri"
}

[ "$(id -u)" = 0 ] || { log "debootstrap needs root: run this as root once (the tarball is then cached)"; exit 1; }
if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq debootstrap >&2 ||
        { apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 &&
            apt-get -o DPkg::Lock::Timeout=300 install -y -qq debootstrap >&2; }
fi

MIRROR="$(mirror)"
mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "debootstrap --variant=minbase --include=$INCLUDE $SUITE from $MIRROR (once; a minute or two)"
if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/log" 2>&1; then
    log "debootstrap failed; last lines:"
    tail -n 20 "$WORK/log" >&2
    [ -f "$WORK/rootfs/debootstrap/debootstrap.log" ] && tail -n 20 "$WORK/rootfs/debootstrap/debootstrap.log" >&2
    exit 1
fi
R="$WORK/rootfs"
# What a container does not need: package caches and lists, documentation, device nodes (Docker
# makes /dev), and the build host's name settings (Docker writes its own).
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* \
    "$R"/usr/share/man/* "$R"/usr/share/info/* "$R"/usr/share/locale/* "$R"/var/log/*.log \
    "$R"/debootstrap
find "$R/dev" -mindepth 1 -delete
: >"$R/etc/hostname"
tar -C "$R" --numeric-owner -cf "$WORK/rootfs.tar" .
mv "$WORK/rootfs.tar" "$TARBALL"
log "cached $TARBALL ($(du -m "$TARBALL" | cut -f1) MiB)"
echo "$TARBALL"
