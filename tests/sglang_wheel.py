"""The pinned SGLang release's wheel, for the tests that read SGLang's own source.

The wheel is downloaded once with pip (``--no-deps``: 39 MB, no torch) into ``.cache/sglang/``
(git-ignored) and read as a zip file: nothing of it is installed or imported. ``make test``
fetches it first (``python -m tests.sglang_wheel``); the ``sglang_source`` fixture fetches it
too when it is missing, and fails the test, never skips it, when it cannot.

One fixed file (CPython 3.11, manylinux x86_64) on every machine: SGLang's Python sources are
the same in each of its platform wheels, and a fixed file keeps the check the same everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workers.node.sglang_release import SGLANG_PIP_SPEC, SGLANG_VERSION

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "sglang"
PYTHON_TAG, PLATFORM = "cp311", "manylinux_2_34_x86_64"


class WheelUnavailable(RuntimeError):
    """The wheel is not in the cache and pip could not download it."""


def wheel_name(version: str = SGLANG_VERSION) -> str:
    return f"sglang-{version}-{PYTHON_TAG}-{PYTHON_TAG}-{PLATFORM}.whl"


def ensure_wheel(cache: Path = CACHE) -> Path:
    """The cached wheel's path, downloading it first when it is missing (or not a zip file)."""
    target = cache / wheel_name()
    if target.is_file() and zipfile.is_zipfile(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--only-binary=:all:", "--implementation", "cp"),
            *("--python-version", "3.11", "--abi", PYTHON_TAG, "--platform", PLATFORM),
            *("--dest", tmp, SGLANG_PIP_SPEC),
        ]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            error = res.stderr.strip()[-1500:] if res.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
        got = Path(tmp) / wheel_name()
        if error or not got.is_file():
            raise WheelUnavailable(
                f"the SGLang flag check needs {wheel_name()} ({SGLANG_PIP_SPEC}) in {cache}, and "
                f"`pip download` could not fetch it: {error or 'no such file after the download'}\n"
                "Run `make sglang-wheel` where PyPI is reachable, or copy that file there."
            )
        os.replace(got, target)  # atomic: a concurrent run sees the whole file or none
    return target


class SglangSource:
    """Read-only access to ``sglang/...`` source files inside the wheel."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self._zip = zipfile.ZipFile(wheel)

    def read(self, path: str) -> str:
        """``path`` relative to the package, e.g. ``srt/server_args.py``."""
        return self._zip.read(f"sglang/{path}").decode()

    def listdir(self, folder: str) -> list[str]:
        """The ``.py`` files directly in ``folder`` (relative to the package), sorted."""
        prefix = f"sglang/{folder.rstrip('/')}/"
        names = (n[len(prefix) :] for n in self._zip.namelist() if n.startswith(prefix))
        return sorted(f"{folder.rstrip('/')}/{n}" for n in names if n.endswith(".py") and "/" not in n)

    def close(self) -> None:
        self._zip.close()


if __name__ == "__main__":
    try:
        print(f"sglang wheel: {ensure_wheel()}")
    except WheelUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
