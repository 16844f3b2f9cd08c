#!/usr/bin/env bash
# Run LocalStack's S3 on 127.0.0.1 without Docker, for the alpineagents_s3 integration suite.
#
#   bash localstack/localstack.sh install   # its own virtual environment in localstack/.venv
#   bash localstack/localstack.sh start     # in the background; pid and log in localstack/.state
#   bash localstack/localstack.sh wait      # until S3 answers (timeout: LOCALSTACK_WAIT_SECONDS)
#   bash localstack/localstack.sh stop      # SIGTERM, then SIGKILL after LOCALSTACK_STOP_SECONDS
#   bash localstack/localstack.sh status
#
# Then: ALPINEAGENTS_LOCALSTACK_URL=http://127.0.0.1:4566 python -m pytest -m integration tests/s3
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${LOCALSTACK_VENV:-$HERE/.venv}"
STATE_DIR="${LOCALSTACK_STATE_DIR:-$HERE/.state}"
PID_FILE="$STATE_DIR/localstack.pid"
LOG_FILE="$STATE_DIR/localstack.log"
HOST="${LOCALSTACK_HOST_ADDRESS:-127.0.0.1}"
PORT="${LOCALSTACK_PORT:-4566}"
URL="http://$HOST:$PORT"
PYTHON="${LOCALSTACK_PYTHON:-python3}"
WAIT_SECONDS="${LOCALSTACK_WAIT_SECONDS:-60}"
STOP_SECONDS="${LOCALSTACK_STOP_SECONDS:-10}"

# The versions the integration suite was run against. localstack-core 4.13.1 needs the
# others pinned: newer cbor2 / pyopenssl / cryptography releases break its imports.
PINS=(
    "localstack-core[runtime]==4.13.1"
    "cbor2<6"
    "pyopenssl>=25,<26"
    "cryptography>=45,<47"
    "service_identity"
)

log() { echo "localstack.sh: $*" >&2; }

running_pid() {
    # The pid of a LocalStack we started that is still alive, or nothing.
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && { echo "$pid"; return 0; }
    return 1
}

ready() {
    # S3 is ready when the health endpoint reports it "running" or "available".
    "$VENV/bin/python" - "$URL" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/_localstack/health", timeout=2) as r:
        health = json.load(r)
except Exception:
    sys.exit(1)
sys.exit(0 if health.get("services", {}).get("s3") in ("running", "available") else 1)
PY
}

cmd_install() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV"
    fi
    # (A pip configuration with find-links folders that do not exist warns once per package:
    # those lines are dropped, the rest of pip's output is kept.)
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    "$VENV/bin/python" -c "import localstack.runtime.main" \
        || { log "localstack is installed but does not import"; exit 1; }
    log "installed: $("$VENV/bin/python" -m pip show localstack-core | grep '^Version')"
}

cmd_start() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) at $URL"
        return 0
    fi
    [[ -x "$VENV/bin/python" ]] || { log "not installed: run '$0 install' first"; exit 1; }
    mkdir -p "$STATE_DIR/data"
    # setsid: its own process group, so stop can signal LocalStack and its children.
    (
        cd "$STATE_DIR"
        DNS_ADDRESS=0 \
        GATEWAY_SERVER=hypercorn \
        GATEWAY_LISTEN="$HOST:$PORT" \
        SERVICES=s3 \
        EAGER_SERVICE_LOADING=1 \
        SKIP_SSL_CERT_DOWNLOAD=1 \
        DISABLE_EVENTS=1 \
        LOCALSTACK_VOLUME_DIR="$STATE_DIR/data" \
        FILESYSTEM_ROOT="$STATE_DIR/data" \
        exec setsid "$VENV/bin/python" -m localstack.runtime.main
    ) </dev/null >"$LOG_FILE" 2>&1 &
    echo $! >"$PID_FILE"
    log "started (pid $(cat "$PID_FILE")) at $URL; log: $LOG_FILE"
}

cmd_wait() {
    local deadline=$((SECONDS + WAIT_SECONDS))
    while ! ready; do
        if ! running_pid >/dev/null; then
            log "LocalStack is not running; the end of its log:"
            tail -n 30 "$LOG_FILE" >&2 || true
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            log "not ready after ${WAIT_SECONDS}s; the end of its log:"
            tail -n 30 "$LOG_FILE" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    log "ready at $URL"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        log "not running"
        rm -f "$PID_FILE"
        return 0
    fi
    log "stopping pid $pid (SIGTERM)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_SECONDS))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "still running after ${STOP_SECONDS}s: SIGKILL"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        if ready; then log "running (pid $pid), ready at $URL"; else log "running (pid $pid), not ready"; fi
    else
        log "not running"
        return 1
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    wait) cmd_wait ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 install|start|wait|stop|status" >&2
        exit 2
        ;;
esac
