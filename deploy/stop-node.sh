#!/usr/bin/env bash
# Stop a node started with deploy/start-node.sh --detach (under systemd: systemctl stop dflash-node).
#
#   deploy/stop-node.sh [--now] [TIMEOUT]
#
# SIGTERM: the workers stop taking chunks and finish the ones they run (Celery warm shutdown),
# then the servers stop. Waits up to TIMEOUT seconds (default 900). --now (or a timeout) sends a
# second SIGTERM: the node stops waiting for running chunks; their leases expire and live workers
# re-queue them, so nothing is lost, only redone.
set -euo pipefail

ENV_FILE=${ENV_FILE:-/etc/dflash/node.env}
if [ -r "$ENV_FILE" ]; then  # under systemd, EnvironmentFile= has set these already
    set -a
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    set +a
fi
LOG_DIR=${DFLASH_LOG_DIR:-logs}
PID_FILE=${PID_FILE:-$LOG_DIR/node.pid}

now=0
if [ "${1:-}" = "--now" ]; then
    now=1
    shift
fi
TIMEOUT=${1:-900}

if [ ! -f "$PID_FILE" ]; then
    echo "stop-node: no $PID_FILE: no detached node here" >&2
    exit 1
fi
pid=$(cat "$PID_FILE")
if ! kill -0 "$pid" 2>/dev/null; then
    echo "stop-node: node $pid is not running; removing $PID_FILE"
    rm -f "$PID_FILE"
    exit 0
fi

wait_for_exit() {
    local limit=$1 waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge "$limit" ]; then
            return 1
        fi
        if [ $((waited % 30)) -eq 0 ] && [ "$waited" -gt 0 ]; then
            echo "stop-node: still stopping after ${waited}s (running chunks finish first)"
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

echo "stop-node: SIGTERM to node $pid"
kill -TERM "$pid"
if [ "$now" = 1 ]; then
    sleep 1
    kill -TERM "$pid" 2>/dev/null || true
fi
if ! wait_for_exit "$TIMEOUT"; then
    echo "stop-node: not stopped after ${TIMEOUT}s; second SIGTERM (stop waiting for chunks)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for_exit 120; then
        echo "stop-node: killing node $pid (its servers and workers get SIGTERM as it dies)"
        kill -KILL "$pid" 2>/dev/null || true
    fi
fi
rm -f "$PID_FILE"
echo "stop-node: stopped"
