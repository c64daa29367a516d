#!/usr/bin/env bash
# Install dflash-tasks and SGLang into a virtualenv on a bare GPU node.
#
#   deploy/install.sh [--venv DIR] [--no-sglang] [--sglang-venv DIR] [--print-sglang-spec]
#
#   --venv DIR          the virtualenv (default: $VENV_DIR, else /opt/dflash/venv)
#   --no-sglang         the package only (a producer, Flower, or a --simulate node)
#   --sglang-venv DIR   SGLang in its own virtualenv; then start the node with
#                       --sglang-python DIR/bin/python
#   --print-sglang-spec print the SGLang requirement it would install, and exit
#
# SGLANG_SPEC picks the SGLang release (default: SGLANG_PIP_SPEC, the release pinned in
# workers/node/sglang_release.py, which the tests check our launch flags against);
# PYTHON the interpreter (python3, >= 3.11). Re-running upgrades in place. Nothing here needs the
# network beyond the package index.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV_DIR:-/opt/dflash/venv}
PY=${PYTHON:-python3}
SPEC=${SGLANG_SPEC:-}
WITH_SGLANG=1
SGLANG_VENV=""
PRINT_SPEC=0

die() {
    echo "install: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=${2:?--venv needs a directory}; shift 2 ;;
        --no-sglang) WITH_SGLANG=0; shift ;;
        --sglang-venv) SGLANG_VENV=${2:?--sglang-venv needs a directory}; shift 2 ;;
        --print-sglang-spec) PRINT_SPEC=1; shift ;;
        -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install Python >= 3.11"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PY is $("$PY" -V 2>&1); dflash-tasks needs Python >= 3.11"
if [ -z "$SPEC" ]; then  # the one pinned release, read from its module (which imports nothing)
    SPEC=$("$PY" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["SGLANG_PIP_SPEC"])' \
        "$ROOT/workers/node/sglang_release.py") || die "cannot read the pinned SGLang release"
fi
if [ "$PRINT_SPEC" = 1 ]; then
    echo "$SPEC"
    exit 0
fi
"$PY" -c 'import ensurepip, venv' 2>/dev/null \
    || die "$PY cannot create virtualenvs; on Debian/Ubuntu: apt-get install python3-venv"

make_venv() {
    if [ ! -x "$1/bin/python" ]; then
        echo "install: creating $1"
        mkdir -p "$(dirname "$1")"
        "$PY" -m venv "$1"
    fi
    "$1/bin/python" -m pip install --quiet --upgrade pip
}

make_venv "$VENV"
echo "install: dflash-tasks from $ROOT into $VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade "$ROOT"

if [ "$WITH_SGLANG" = 1 ]; then
    target=${SGLANG_VENV:-$VENV}
    [ "$target" = "$VENV" ] || make_venv "$target"
    echo "install: $SPEC into $target (large: torch, CUDA kernels)"
    "$target/bin/python" -m pip install --quiet --upgrade "$SPEC"
    version=$("$target/bin/python" -c 'import sglang; print(sglang.__version__)')
    echo "install: sglang $version"
    if [ "$target" != "$VENV" ]; then
        echo "install: start nodes with --sglang-python $target/bin/python"
    fi
fi

"$VENV/bin/python" -m workers.node --help >/dev/null
if command -v nvidia-smi >/dev/null 2>&1; then
    echo "install: GPUs on this node:"
    nvidia-smi -L
else
    echo "install: no nvidia-smi here (fine for a producer or a --simulate node)"
fi
cat <<DONE
install: done. Next:
  sudo install -D -m 600 $ROOT/deploy/env.example /etc/dflash/node.env  # then edit it
  $ROOT/deploy/stage-model.sh                                          # the seed into /dev/shm
  $ROOT/deploy/start-node.sh                                           # or the systemd unit
DONE
