#!/usr/bin/env bash
# Copy the model (the seed) to RAM disk, so that every SGLang server on the node loads it from
# memory instead of 7 processes reading one network disk at once.
#
#   deploy/stage-model.sh [SRC [DEST]]
#
#   SRC   a model directory: a network-disk copy, or a Hugging Face cache snapshot (symlinks are
#         followed). Default: $MODEL_SRC.
#   DEST  default: $DFLASH_MODEL_PATH, else /dev/shm/models/<basename of SRC>.
#
# Reads ENV_FILE (default /etc/dflash/node.env) when it exists. Idempotent: an already staged,
# complete copy of the same size is kept. The copy goes to DEST.partial and is renamed when
# complete, so a server never loads half a model. /dev/shm is emptied by a reboot: the systemd
# unit runs this script before each start. With neither SRC nor MODEL_SRC, it only checks DEST.
set -euo pipefail

ENV_FILE=${ENV_FILE:-/etc/dflash/node.env}
if [ -r "$ENV_FILE" ]; then  # under systemd, EnvironmentFile= has set these already
    set -a
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    set +a
fi

die() {
    echo "stage-model: $*" >&2
    exit 1
}

SRC=${1:-${MODEL_SRC:-}}
DEST=${2:-${DFLASH_MODEL_PATH:-}}
if [ -z "$SRC" ]; then
    [ -n "$DEST" ] || die "usage: $0 SRC [DEST] (or set MODEL_SRC and DFLASH_MODEL_PATH)"
    [ -f "$DEST/config.json" ] || die "nothing to stage from (MODEL_SRC unset) and $DEST holds no model"
    echo "stage-model: $DEST is there (MODEL_SRC unset: nothing to copy)"
    exit 0
fi
SRC=${SRC%/}
[ -d "$SRC" ] || die "$SRC is not a directory (download it first, e.g. huggingface-cli download Qwen/Qwen3-8B --local-dir $SRC)"
[ -f "$SRC/config.json" ] || die "$SRC has no config.json: not a model directory"
DEST=${DEST:-/dev/shm/models/$(basename "$SRC")}
DEST=${DEST%/}
PARENT=$(dirname "$DEST")
mkdir -p "$PARENT"

need=$(du -sbL "$SRC" | cut -f1)
if [ -f "$DEST/.staged" ] && [ "$(cat "$DEST/.staged")" = "$need" ]; then
    echo "stage-model: $DEST already staged ($((need / 1024 / 1024)) MiB)"
    exit 0
fi

rm -rf "$DEST.partial"
# Room for the new copy; an old copy at DEST is replaced only once the new one is complete.
avail=$(df -B1 --output=avail "$PARENT" | tail -n 1 | tr -d ' ')
if [ "$need" -ge "$avail" ]; then
    die "$SRC needs $((need / 1024 / 1024 / 1024)) GiB, $PARENT has $((avail / 1024 / 1024 / 1024)) GiB free (e.g. mount -o remount,size=200G /dev/shm)"
fi

echo "stage-model: copying $SRC ($((need / 1024 / 1024)) MiB) to $DEST ..."
started=$(date +%s)
mkdir -p "$DEST.partial"
cp -rL --preserve=mode,timestamps "$SRC/." "$DEST.partial/"
echo "$need" >"$DEST.partial/.staged"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
echo "stage-model: staged in $(($(date +%s) - started))s: DFLASH_MODEL_PATH=$DEST"
