#!/usr/bin/env bash
# Follow a node's logs: deploy/tail-logs.sh [gpuN ...] [--servers | --workers]
#
# Without names, every GPU's server and worker log plus the node's own output (node.out, when
# started with --detach; under systemd: journalctl -u dflash-node -f). LINES sets how many old
# lines to show first (default 20). The log folder: DFLASH_LOG_DIR (from ENV_FILE, default
# /etc/dflash/node.env), else ./logs.
set -euo pipefail

ENV_FILE=${ENV_FILE:-/etc/dflash/node.env}
if [ -r "$ENV_FILE" ]; then  # under systemd, EnvironmentFile= has set these already
    set -a
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    set +a
fi
LOG_DIR=${DFLASH_LOG_DIR:-logs}

roles=(server worker)
gpus=()
for arg in "$@"; do
    case "$arg" in
        --servers) roles=(server) ;;
        --workers) roles=(worker) ;;
        gpu[0-9]*) gpus+=("$arg") ;;
        [0-9]*) gpus+=("gpu$arg") ;;
        *) echo "tail-logs: unknown argument $arg (gpuN, --servers, --workers)" >&2; exit 2 ;;
    esac
done

files=()
if [ ${#gpus[@]} -eq 0 ]; then
    for role in "${roles[@]}"; do
        for f in "$LOG_DIR"/gpu*-"$role".log; do
            [ -e "$f" ] && files+=("$f")
        done
    done
    [ -e "$LOG_DIR/node.out" ] && files+=("$LOG_DIR/node.out")
else
    for gpu in "${gpus[@]}"; do
        for role in "${roles[@]}"; do
            files+=("$LOG_DIR/$gpu-$role.log")
        done
    done
fi
if [ ${#files[@]} -eq 0 ]; then
    echo "tail-logs: no logs in $LOG_DIR yet" >&2
    exit 1
fi
exec tail -n "${LINES:-20}" -F "${files[@]}"
