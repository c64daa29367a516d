#!/usr/bin/env bash
# Real-GPU checks, each in minutes, exiting 1 when a goal is missed (docs/performance.md):
#
#   benchmarks/gpu_check.sh MODEL_DIR [PROMPTS] [SGLANG_PYTHON]
#   benchmarks/gpu_check.sh stream MODEL_DIR [PROMPTS_PER_SLOT] [SGLANG_PYTHON]
#
# The first: the in-flight tuner, SGLang serving a local model, a sweep of fixed targets, then
# jobs at a fixed 48, at the best fixed target and with the tuner; prints the same table as
# `python -m benchmarks tune`. `stream`: one SGLang started with the node launcher's flags
# (`--stream-interval`, the caps at 256, metrics), then `python -m benchmarks stream` against it
# at 48 and at 256 in flight: streamed requests (loop detection on) against plain ones,
# PROMPTS_PER_SLOT prompts a slot (default 3: about 25 minutes for a 8B model on one GPU).
#
# MODEL_DIR is a local checkpoint (nothing is downloaded); SGLANG_PYTHON an interpreter with the
# pinned SGLang (default: this venv's). Needs a node set up by deploy/install.sh (this package,
# redis-server) and one free GPU (CUDA_VISIBLE_DEVICES picks it). Extra SGLang flags:
# SGLANG_ARGS='--mem-fraction-static 0.85'; the stream check's port: PORT (default 30123).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=.venv/bin/python
[ -x "$py" ] || py=python3

# SGLang with the node launcher's command line (workers/node/launch.py), in its own session.
start_sglang() {  # MODEL_DIR PYTHON PORT LOG
    local cmd
    mapfile -d '' cmd < <("$py" -c '
import shlex, sys
from workers.node.launch import sglang_command
python, model, port, extra = sys.argv[1:]
sys.stdout.write("\0".join(sglang_command(python, model, int(port), 256, shlex.split(extra))))
' "$2" "$1" "$3" "${SGLANG_ARGS:-}")
    setsid "${cmd[@]}" >"$4" 2>&1 &
    server=$!
    trap 'kill -TERM -- "-$server" 2>/dev/null || true' EXIT
    local url="http://127.0.0.1:$3/health_generate" waited=0
    until "$py" -c 'import sys, requests; sys.exit(requests.get(sys.argv[1], timeout=30).status_code != 200)' \
        "$url" 2>/dev/null; do
        kill -0 "$server" 2>/dev/null || { echo "error: SGLang exited:" >&2; tail -50 "$4" >&2; exit 2; }
        [ "$waited" -lt 1800 ] || { echo "error: SGLang not healthy after 1800 s (log: $4)" >&2; exit 2; }
        sleep 5
        waited=$((waited + 5))
    done
}

if [ "${1:-}" = stream ]; then
    model=${2:?usage: benchmarks/gpu_check.sh stream MODEL_DIR [PROMPTS_PER_SLOT] [SGLANG_PYTHON]}
    per_slot=${3:-3}
    python=${4:-$py}
    [ -d "$model" ] || { echo "error: $model is not a local model directory" >&2; exit 2; }
    port=${PORT:-30123}
    log=$(mktemp -t sglang-stream.XXXXXX.log)
    start_sglang "$model" "$python" "$port" "$log"
    rc=0
    for slots in 48 256; do
        "$py" -m benchmarks stream --set "endpoint=http://127.0.0.1:$port" --set "model=$model" \
            --set "slots=$slots" --set "prompts_per_server=$((slots * per_slot))" || rc=$?
    done
    exit "$rc"
fi

model=${1:?usage: benchmarks/gpu_check.sh MODEL_DIR [PROMPTS] [SGLANG_PYTHON]}
prompts=${2:-4000}
python=${3:-}
[ -d "$model" ] || { echo "error: $model is not a local model directory" >&2; exit 2; }
args=(tune --quick --set curves=sglang --set "model=$model" --set "prompts=$prompts")
[ -n "$python" ] && args+=(--set "sglang_python=$python")
[ -n "${SGLANG_ARGS:-}" ] && args+=(--set "sglang_args=$SGLANG_ARGS")
exec "$py" -m benchmarks "${args[@]}"
