#!/bin/bash
# sonic-link: gives this container's network a VM's link, shaped by Linux traffic control, then
# runs its command without the capability to change it. deploy/cluster.sh starts every agent
# and the memory tier (sonic-redis) through it (the container needs --cap-add NET_ADMIN);
# installed in sonic-agent-host and sonic-redis as /usr/local/bin/sonic-link.
#
#   sonic-link [--check] [--] COMMAND ARGS...
#
#   SONIC_LINK_MBPS              the VM's rate, each way, megabits per second (absent or empty:
#                                no shaping, the command runs as is)
#   SONIC_LINK_STORE_PORT        the object store's TCP port (default 8333; `none`: no class of
#                                the store's, all traffic in one: the memory tier's own link)
#   SONIC_LINK_STORE_WRITE_MBPS  one VM's uploads to the store (traffic to that port), at most
#                                this and the VM's rate (absent: the VM's rate alone)
#   SONIC_LINK_STORE_READ_MBPS   one VM's downloads from the store (traffic from that port)
#   SONIC_LINK_DEV               the interface (default eth0)
#   SONIC_LINK_STORE_DELAY_MS    a delay line in front of the store (sonic-delay, on
#                                127.0.0.1:PORT; the container maps the store's name there with
#                                --add-host): every byte sent to the store is held this long, so
#                                every request takes this much longer (absent or 0: none)
#   SONIC_LINK_STORE_ORIGIN      where the delay line forwards to (default
#                                sonic-store-origin:PORT, the store's alias on the network)
#   SONIC_LINK_MEMORY_DELAY_MS   the same in front of the memory tier (Redis): a second delay
#                                line on 127.0.0.1:MEMORY_PORT, where the container maps the
#                                tier's name (absent or 0: none)
#   SONIC_LINK_MEMORY_PORT       the memory tier's TCP port (default 6379)
#   SONIC_LINK_MEMORY_ORIGIN     where that delay line forwards to (default
#                                sonic-redis-origin:MEMORY_PORT, the tier's alias on the network)
#
# Egress: an htb tree on the interface, the VM's rate at the root, the store's uploads in a class
# of their own capped at the store's write rate, everything else in another; the two share the
# root fairly (each is guaranteed half, borrows up to its cap). Ingress: the interface's incoming
# packets are redirected to an ifb device whose egress has the same tree (the store's downloads
# capped at its read rate). The kernel cannot add delay here (no netem): request latency is the
# store's own plus the delay line's (deploy/measure-store.sh measures it); the memory tier's
# likewise. --check shapes, prints the classes and exits 0 (or 1 with what is missing).
set -euo pipefail

log() { echo "sonic-link: $*" >&2; }
die() { echo "sonic-link: $*" >&2; exit 1; }

CHECK=0
if [ "${1:-}" = --check ]; then CHECK=1; shift; fi
[ "${1:-}" = -- ] && shift

DEV="${SONIC_LINK_DEV:-eth0}"
IFB=ifb0
PORT="${SONIC_LINK_STORE_PORT:-8333}"
MBPS="${SONIC_LINK_MBPS:-}"

# kbit MBPS: a rate in whole kilobits per second (tc's unit), at least 8.
kbit() { awk -v m="$1" 'BEGIN { k = int(m * 1000 + 0.5); if (k < 8) k = 8; print k }'; }
# burst KBIT: bytes one class may send at once: 5 ms of its rate, at least 128 KiB (a GSO/GRO
# packet is up to 64 KiB; a bucket smaller than one would stall it).
burst() { awk -v k="$1" 'BEGIN { b = int(k * 1000 / 8 * 0.005); if (b < 131072) b = 131072; print b }'; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a < b ? a : b) }'; }
positive() { awk -v v="$1" 'BEGIN { exit !(v + 0 > 0) }'; }

# tree DEV STORE_MBPS MATCH: the htb tree on DEV's egress; MATCH is `dport` or `sport`.
tree() {
    local dev="$1" store="$2" match="$3" root rest cap b
    root="$(kbit "$MBPS")"
    b="$(burst "$root")"
    tc qdisc replace dev "$dev" root handle 1: htb default 20
    tc class replace dev "$dev" parent 1: classid 1:1 htb rate "${root}kbit" ceil "${root}kbit" \
        burst "$b" cburst "$b"
    rest=$((root / 2))
    [ "$rest" -ge 8 ] || rest=8
    tc class replace dev "$dev" parent 1:1 classid 1:20 htb rate "${rest}kbit" ceil "${root}kbit" \
        burst "$b" cburst "$b" quantum 65536
    cap="$root"
    if [ "$PORT" = none ]; then
        echo "$root -"
        return
    fi
    if [ -n "$store" ]; then
        cap="$(kbit "$(min "$MBPS" "$store")")"
    fi
    tc class replace dev "$dev" parent 1:1 classid 1:10 htb rate "$((rest < cap ? rest : cap))kbit" ceil "${cap}kbit" \
        burst "$(burst "$cap")" cburst "$(burst "$cap")" quantum 65536
    tc filter replace dev "$dev" parent 1: protocol ip prio 1 handle 800::10 u32 \
        match ip "$match" "$PORT" 0xffff flowid 1:10
    echo "$root $cap"
}

if [ -z "$MBPS" ]; then
    [ "$CHECK" = 1 ] && die "SONIC_LINK_MBPS is not set: nothing to shape"
    exec "$@"
fi
positive "$MBPS" || die "SONIC_LINK_MBPS=$MBPS: not a positive number of megabits per second"
case "$PORT" in
    none) ;;
    *[!0-9]* | "") die "SONIC_LINK_STORE_PORT=$PORT: a TCP port or none" ;;
esac
for v in SONIC_LINK_STORE_WRITE_MBPS SONIC_LINK_STORE_READ_MBPS SONIC_LINK_STORE_DELAY_MS SONIC_LINK_MEMORY_DELAY_MS; do
    if [ -n "${!v:-}" ]; then positive "${!v}" || die "$v=${!v}: not a positive number"; fi
done
command -v tc >/dev/null || die "tc is missing (the image needs iproute2)"
ip link show "$DEV" >/dev/null 2>&1 || die "no interface $DEV"

# Egress.
out="$(tree "$DEV" "${SONIC_LINK_STORE_WRITE_MBPS:-}" dport 2>&1)" ||
    die "shaping $DEV failed (the container needs --cap-add NET_ADMIN, the kernel htb and u32): $out"
read -r e_root e_store <<<"$(tail -n 1 <<<"$out")"

# Ingress, through an ifb device.
if ! ip link show "$IFB" >/dev/null 2>&1; then
    ip link add "$IFB" type ifb 2>/dev/null || die "no ifb device (the kernel needs ifb for ingress shaping)"
fi
ip link set "$IFB" up
tc qdisc del dev "$DEV" ingress 2>/dev/null || true
tc qdisc add dev "$DEV" handle ffff: ingress || die "no ingress qdisc on $DEV"
tc filter add dev "$DEV" parent ffff: protocol all u32 match u32 0 0 \
    action mirred egress redirect dev "$IFB" || die "cannot redirect $DEV's ingress to $IFB (mirred)"
out="$(tree "$IFB" "${SONIC_LINK_STORE_READ_MBPS:-}" sport 2>&1)" || die "shaping $IFB failed: $out"
read -r i_root i_store <<<"$(tail -n 1 <<<"$out")"

if [ "$PORT" = none ]; then
    log "$DEV egress ${e_root} kbit/s, ingress ${i_root} kbit/s (one class each way)"
else
    log "$DEV egress ${e_root} kbit/s (store uploads, port $PORT: ${e_store}), ingress ${i_root} kbit/s (store downloads: ${i_store})"
fi

# delay_line PORT ORIGIN DELAY_MS: a delay line on 127.0.0.1:PORT to ORIGIN, without the
# capability either; returns once it listens.
delay_line() {
    local port="$1" origin="$2" delay="$3"
    setpriv --inh-caps=-net_admin --bounding-set=-net_admin -- \
        python3 /usr/local/bin/sonic-delay --listen "127.0.0.1:$port" --to "$origin" --delay-ms "$delay" &
    for _ in $(seq 1 100); do
        if python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' "$port" 2>/dev/null; then
            return
        fi
        kill -0 $! 2>/dev/null || die "the delay line (sonic-delay) to $origin exited"
        sleep 0.1
    done
    log "the delay line (sonic-delay) to $origin does not listen on 127.0.0.1:$port yet; going on"
}

# The delay lines; the command starts once they listen.
DELAY="${SONIC_LINK_STORE_DELAY_MS:-0}"
if [ "$CHECK" = 0 ] && positive "$DELAY"; then
    [ "$PORT" != none ] || die "SONIC_LINK_STORE_DELAY_MS needs the store's port (SONIC_LINK_STORE_PORT)"
    delay_line "$PORT" "${SONIC_LINK_STORE_ORIGIN:-sonic-store-origin:$PORT}" "$DELAY"
fi
MEMORY_DELAY="${SONIC_LINK_MEMORY_DELAY_MS:-0}"
if [ "$CHECK" = 0 ] && positive "$MEMORY_DELAY"; then
    MEMORY_PORT="${SONIC_LINK_MEMORY_PORT:-6379}"
    case "$MEMORY_PORT" in *[!0-9]* | "") die "SONIC_LINK_MEMORY_PORT=$MEMORY_PORT: not a TCP port" ;; esac
    delay_line "$MEMORY_PORT" "${SONIC_LINK_MEMORY_ORIGIN:-sonic-redis-origin:$MEMORY_PORT}" "$MEMORY_DELAY"
fi
if [ "$CHECK" = 1 ]; then
    tc class show dev "$DEV"
    tc class show dev "$IFB"
    exit 0
fi
[ "$#" -gt 0 ] || die "no command to run"
# The command, and everything it starts, cannot change the shaping.
exec setpriv --inh-caps=-net_admin --bounding-set=-net_admin -- "$@"
