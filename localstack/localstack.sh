#!/usr/bin/env bash
# Run LocalStack's S3 on 127.0.0.1 without Docker, for the alpineagents_s3 integration suite.
#
#   bash localstack/localstack.sh install   # its own virtual environment in localstack/.venv
#   bash localstack/localstack.sh start     # in the background; pid and log in localstack/.state
#   bash localstack/localstack.sh wait      # until S3 answers (timeout: LOCALSTACK_WAIT_SECONDS)
#   bash localstack/localstack.sh stop      # SIGTERM, then SIGKILL after LOCALSTACK_STOP_SECONDS
#   bash localstack/localstack.sh status
#   bash localstack/localstack.sh url       # the endpoint, for ALPINEAGENTS_LOCALSTACK_URL
#
# Then: ALPINEAGENTS_LOCALSTACK_URL="$(bash localstack/localstack.sh url)" \
#           python -m pytest -m integration tests/s3
#
# The port is LOCALSTACK_PORT (default 4566) on LOCALSTACK_HOST_ADDRESS (default 127.0.0.1).
# start refuses (exit 3) when another process already listens there, and names it; wait and
# status report "ready" only when the listener is the LocalStack this script started.
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

port_holder() {
    # "free" if HOST:PORT can be bound; else "taken" and what listens there: "pid=N pgid=N cmd=…"
    # (from ss -ltnp, else /proc/net/tcp* and /proc/*/fd), or "unknown" if it cannot tell.
    "$PYTHON" - "$HOST" "$PORT" <<'PY'
import os, re, socket, subprocess, sys

host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
probe = socket.socket(family, socket.SOCK_STREAM)
# SO_REUSEADDR: connections of a stopped server in TIME_WAIT do not count; a listener does.
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind((host, port))
except OSError:
    taken = True
else:
    taken = False
finally:
    probe.close()
if not taken:
    print("free")
    sys.exit(0)


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = ""
    return f"pid={pid} pgid={pgid} cmd={cmd or '?'}"


def from_ss():
    try:
        out = subprocess.run(
            ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.findall(r"pid=(\d+)", out)
    return int(found[0]) if found else None


def from_proc():
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


pid = from_ss() or from_proc()
print("taken " + (describe(pid) if pid else "unknown"))
PY
}

ours() {
    # Whether the process listening on the port belongs to the LocalStack we started (its
    # process group, as setsid made it). Unknown holders count as not ours.
    local pid="$1" holder
    holder="$(port_holder)"
    [[ "$holder" == taken\ pid=* ]] || return 1
    [[ "$holder" =~ pgid=([0-9]+) ]] || return 1
    [[ "${BASH_REMATCH[1]}" == "$pid" ]]
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
    local holder
    holder="$(port_holder)"
    if [[ "$holder" != free ]]; then
        holder="${holder#taken }"
        if [[ "$holder" == unknown ]]; then
            holder="another process (run 'ss -ltnp' to see which)"
        fi
        log "port $PORT on $HOST is already in use by $holder: not starting. Stop it, or pick" \
            "another port with LOCALSTACK_PORT=<port> (and point ALPINEAGENTS_LOCALSTACK_URL at it)"
        exit 3
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
    local deadline=$((SECONDS + WAIT_SECONDS)) pid
    while true; do
        if ! pid="$(running_pid)"; then
            log "LocalStack is not running; the end of its log:"
            tail -n 30 "$LOG_FILE" >&2 || true
            exit 1
        fi
        if ready; then
            if ours "$pid"; then
                log "ready at $URL (pid $pid)"
                return 0
            fi
            log "something answers at $URL, but not the LocalStack started here (pid $pid):" \
                "$(port_holder). Stop it, or use another LOCALSTACK_PORT"
            exit 3
        fi
        if ((SECONDS >= deadline)); then
            log "not ready after ${WAIT_SECONDS}s; the end of its log:"
            tail -n 30 "$LOG_FILE" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
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
        if ! ours "$pid"; then
            log "running (pid $pid), but it does not hold port $PORT: $(port_holder)"
            return 1
        fi
        if ready; then log "running (pid $pid), ready at $URL"; else log "running (pid $pid), not ready"; fi
    else
        log "not running; port $PORT: $(port_holder)"
        return 1
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    wait) cmd_wait ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) echo "$URL" ;;
    *)
        echo "usage: $0 install|start|wait|stop|status|url" >&2
        exit 2
        ;;
esac
