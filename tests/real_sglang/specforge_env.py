"""SpecForge's own code beside the SGLang environment: the judge of the loss-token count.

SpecForge 0.2.0 (PyPI) needs torch, transformers, datasets and pydantic, which the SGLang CPU
environment (:mod:`tests.real_sglang.env`) already has. It is installed ``--no-deps`` into a
directory of its own, ``<cache>/specforge-<version>-py<X.Y>``, put on ``PYTHONPATH`` when that
environment's interpreter runs :mod:`tests.real_sglang.specforge_count`: an additive step keyed on
its own, so the ~7 GB environment is neither changed nor rebuilt. Built under a lock into a
temporary directory and renamed into place once SpecForge's preprocessing imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.real_sglang.env import EnvUnavailable, cache_root, ensure_env, locked

SPECFORGE_VERSION = "0.2.0"
SMOKE = "from specforge.data.preprocessing import preprocess_conversations; from specforge.data.template import TEMPLATE_REGISTRY; TEMPLATE_REGISTRY.get('qwen3.5')"  # noqa: E501


def specforge_dir(python: Path) -> Path:
    version = subprocess.run(
        [str(python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return cache_root() / f"specforge-{SPECFORGE_VERSION}-py{version}"


def _install(python: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".build-{target.name}-"))
    log = cache_root() / f"{target.name}.build.log"
    try:
        pip = [str(python), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--target"]
        steps = [
            ([*pip, str(tmp), f"specforge=={SPECFORGE_VERSION}"], os.environ),
            ([str(python), "-c", SMOKE], {**os.environ, "PYTHONPATH": str(tmp)}),
        ]
        with open(log, "w") as out:
            for cmd, env in steps:
                res = subprocess.run(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900, check=False
                )
                if res.returncode:
                    raise EnvUnavailable(f"{' '.join(cmd[:4])} ... failed (log: {log})")
        (tmp / ".complete").write_text(f"specforge=={SPECFORGE_VERSION}\n")
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_specforge() -> tuple[Path, Path]:
    """The SGLang environment's interpreter and the directory holding SpecForge (installed once)."""
    python = ensure_env()
    target = specforge_dir(python)
    if not (target / ".complete").is_file():
        with locked(cache_root() / f".lock-{target.name}"):
            if not (target / ".complete").is_file():
                _install(python, target)
    return python, target


if __name__ == "__main__":
    try:
        print("specforge: {1} (run with {0})".format(*ensure_specforge()))
    except EnvUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
