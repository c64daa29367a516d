#!/usr/bin/env bash
# The in-flight tuner on a real GPU, in a few minutes: SGLang serving a local model, a sweep of
# fixed targets, then jobs at a fixed 48, at the best fixed target and with the tuner; prints the
# same table as `python -m benchmarks tune` (docs/performance.md).
#
#   benchmarks/gpu_check.sh MODEL_DIR [PROMPTS] [SGLANG_PYTHON]
#
# MODEL_DIR is a local checkpoint (nothing is downloaded); SGLANG_PYTHON an interpreter with the
# pinned SGLang (default: this venv's). Needs a node set up by deploy/install.sh (this package,
# redis-server) and one free GPU (CUDA_VISIBLE_DEVICES picks it). Extra SGLang flags:
# SGLANG_ARGS='--mem-fraction-static 0.85'. Exits 1 when a goal is missed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=${1:?usage: benchmarks/gpu_check.sh MODEL_DIR [PROMPTS] [SGLANG_PYTHON]}
prompts=${2:-4000}
python=${3:-}
[ -d "$model" ] || { echo "error: $model is not a local model directory" >&2; exit 2; }
py=.venv/bin/python
[ -x "$py" ] || py=python3
args=(tune --quick --set curves=sglang --set "model=$model" --set "prompts=$prompts")
[ -n "$python" ] && args+=(--set "sglang_python=$python")
[ -n "${SGLANG_ARGS:-}" ] && args+=(--set "sglang_args=$SGLANG_ARGS")
exec "$py" -m benchmarks "${args[@]}"
