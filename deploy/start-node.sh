#!/usr/bin/env bash
# Start this node: one SGLang server + one worker per GPU (python -m workers.node).
#
#   deploy/start-node.sh [--detach] [workers.node flags ...]
#
# Settings come from ENV_FILE (default /etc/dflash/node.env, see deploy/env.example):
# DFLASH_GPUS, DFLASH_MODEL_PATH, DFLASH_PORT_BASE, DFLASH_MAX_INFLIGHT, DFLASH_LOG_DIR,
# DFLASH_SGLANG_ARGS, DFLASH_BROKER_URL, ...; flags override them (e.g. --simulate, --gpus 0-3).
# In the foreground (systemd's ExecStart) the node replaces this shell. With --detach it runs in
# the background with its output in $DFLASH_LOG_DIR/node.out and its pid in node.pid
# (deploy/stop-node.sh stops it). The virtualenv: VENV_DIR (default /opt/dflash/venv, else the
# checkout's .venv).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENV_FILE=${ENV_FILE:-/etc/dflash/node.env}
if [ -r "$ENV_FILE" ]; then  # under systemd, EnvironmentFile= has set these already
    set -a
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    set +a
fi

VENV=${VENV_DIR:-/opt/dflash/venv}
[ -x "$VENV/bin/python" ] || VENV="$ROOT/.venv"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "start-node: no virtualenv at ${VENV_DIR:-/opt/dflash/venv} or $ROOT/.venv; run deploy/install.sh" >&2; exit 1; }

LOG_DIR=${DFLASH_LOG_DIR:-logs}
export DFLASH_LOG_DIR="$LOG_DIR"
PID_FILE=${PID_FILE:-$LOG_DIR/node.pid}

detach=0
if [ "${1:-}" = "--detach" ] || [ "${1:-}" = "-d" ]; then
    detach=1
    shift
fi

# Catch a bad setting here, with the node's own message, before anything starts.
"$PY" -m workers.node --print-commands "$@" >/dev/null

if [ "$detach" = 0 ]; then
    exec "$PY" -m workers.node "$@"
fi

mkdir -p "$LOG_DIR"
if [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "start-node: a node already runs (pid $(cat "$PID_FILE"), $PID_FILE); deploy/stop-node.sh stops it" >&2
    exit 1
fi
nohup setsid "$PY" -m workers.node "$@" >>"$LOG_DIR/node.out" 2>&1 </dev/null &
echo $! >"$PID_FILE"
sleep 2
if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "start-node: the node exited at once; last lines of $LOG_DIR/node.out:" >&2
    tail -n 20 "$LOG_DIR/node.out" >&2
    rm -f "$PID_FILE"
    exit 1
fi
echo "start-node: node running (pid $(cat "$PID_FILE")); logs: deploy/tail-logs.sh, stop: deploy/stop-node.sh"
