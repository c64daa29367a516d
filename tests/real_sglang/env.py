"""The SGLang environment the real-server tests run: the pinned release on its CPU engine.

Built once and cached outside the repository (CI runs on fresh clones of the same machine), in
``${XDG_CACHE_HOME:-~/.cache}/dflash-tasks/sglang-venv-<version>-<hash>``, where the hash covers
the requirement list, the wheel and the interpreter: a new pin gives a new directory, an unchanged
one is reused. ``make sglang-env`` (``python -m tests.real_sglang.env``) builds it alone;
``make test`` depends on it.

What is installed: the release's wheel with ``--no-deps``, plus its own requirements (read from
the wheel's ``METADATA``, markers evaluated for this machine) less the GPU-only kernels in
:data:`GPU_ONLY`. torch is the release's pin (PyPI's CUDA build, which imports and runs on a
CPU-only machine). The CPU engine still imports a few names from ``sgl_kernel``, whose CPU build
is not on PyPI: the stand-in in ``tests/real_sglang/standin/`` answers them (see its docstring).

The build goes into a temporary directory beside the target, under a lock, and is renamed into
place only once every step passed, so an interrupted build never looks complete and two runs at
once build it once. The venv is used through ``bin/python -m ...`` only (its console scripts'
shebangs name the temporary directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tests.sglang_wheel import WheelUnavailable, ensure_wheel
from workers.node.sglang_release import SGLANG_VERSION

REPO = Path(__file__).resolve().parents[2]
#: The release's requirements left out: CUDA kernels and CUDA-only libraries the CPU engine never loads.
GPU_ONLY = frozenset(
    {
        "flashinfer-python",
        "flash-attn-4",
        "sglang-kernel",
        "sgl-deep-gemm",
        "sgl-deep-ep",
        "sgl-flash-mla",
        "nvidia-cutlass-dsl",
        "tilelang",
        "quack-kernels",
        "humming-kernels",
        "nvshmem4py-cu13",
        "torch-memory-saver",
        "cuda-python",
        "torchaudio",
        "torchcodec",
    }
)
#: Modules the environment must import before it counts as built.
SMOKE = "import torch, transformers, tokenizers, sglang.srt.entrypoints.http_server"
BUILD_TIMEOUT = 3600.0


class EnvUnavailable(RuntimeError):
    """The SGLang environment is not built and could not be built."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dflash-tasks"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` for this machine (no extras), less :data:`GPU_ONLY`, sorted."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(f"sglang-{SGLANG_VERSION}.dist-info/METADATA").decode()
    env: dict[str, str] = {**default_environment(), "extra": ""}  # type: ignore[dict-item]
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if (req.marker and not req.marker.evaluate(env)) or _canonical(req.name) in GPU_ONLY:
            continue
        req.marker = None
        out.append(str(req))
    return sorted(out, key=str.lower)


def env_dir(wheel: Path, reqs: list[str]) -> Path:
    """Where the environment for ``wheel`` and ``reqs`` lives (built or not)."""
    recipe = "\n".join([wheel.name, f"python {sys.version_info[0]}.{sys.version_info[1]}", *reqs])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    return cache_root() / f"sglang-venv-{SGLANG_VERSION}-{digest}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _complete(venv: Path) -> bool:
    return (venv / ".complete").is_file() and python_of(venv).exists()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing), held for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, what: str, timeout: float) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            res = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvUnavailable(f"{what} failed: {exc} (log: {log})") from None
    if res.returncode:
        tail = log.read_text(errors="replace")[-2000:]
        raise EnvUnavailable(f"{what} failed with exit code {res.returncode} (log: {log}):\n{tail}")


def _build(target: Path, wheel: Path, reqs: list[str], log: Path) -> None:
    for stale in target.parent.glob(f".build-{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)  # an earlier build that was interrupted
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".build-{target.name}-"))
    try:
        _run([sys.executable, "-m", "venv", str(tmp)], log, "creating the venv", 300)
        py = str(python_of(tmp))
        (tmp / "requirements.txt").write_text("\n".join(reqs) + "\n")
        pip = [py, "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check"]
        reqs_file = str(tmp / "requirements.txt")
        _run([*pip, "-r", reqs_file], log, "installing SGLang's requirements", BUILD_TIMEOUT)
        _run([*pip, "--no-deps", str(wheel)], log, f"installing {wheel.name}", 600)
        standin = str(REPO / "tests" / "real_sglang" / "standin")
        smoke_env = f"import sys; sys.path.insert(0, {standin!r}); {SMOKE}"
        _run([py, "-c", smoke_env], log, "importing SGLang in the new venv", 600)
        (tmp / ".complete").write_text(f"built {time.strftime('%Y-%m-%d %H:%M:%S')} from {wheel.name}\n")
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_env() -> Path:
    """The environment's interpreter, building the environment first when it is missing.

    Raises :class:`EnvUnavailable` naming the step that failed and its log.
    """
    try:
        wheel = ensure_wheel()
    except WheelUnavailable as exc:
        raise EnvUnavailable(str(exc)) from None
    reqs = requirements(wheel)
    target = env_dir(wheel, reqs)
    if _complete(target):
        return python_of(target)
    with locked(cache_root() / f".lock-{target.name}"):
        if not _complete(target):  # another run may have built it while we waited
            log = cache_root() / f"{target.name}.build.log"
            log.write_text("")
            started = time.monotonic()
            print(f"building the SGLang environment {target} (log: {log}) ...", file=sys.stderr, flush=True)
            _build(target, wheel, reqs, log)
            print(f"built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return python_of(target)


if __name__ == "__main__":
    try:
        print(f"sglang env: {ensure_env()}")
    except EnvUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
