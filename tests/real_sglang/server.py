"""Starting the pinned SGLang release on its CPU engine, as the real-server tests do.

The CPU profile (tests only; the node's GPU profiles are unchanged): ``SGLANG_USE_CPU_ENGINE=1``
with ``--device cpu --attention-backend torch_native`` (every op of a dense Qwen3 falls back to
PyTorch on a CPU without AMX), ``--disable-overlap-schedule``, ``--sleep-on-idle`` (the
scheduler otherwise spins a core while idle), a small KV cache
(``--max-total-tokens``, ``--context-length``: otherwise sized from host RAM), the Python radix
tree (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``) and the ``sgl_kernel`` stand-in on
``PYTHONPATH`` (``tests/real_sglang/standin``). A server whose log shows the stand-in's marker
called a kernel this machine does not have: :func:`standin_calls` finds it and the tests fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import requests

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "real_sglang" / "standin"
#: What the stand-in writes to stderr when one of its ops is called (its MARKER).
STANDIN_MARKER = "SGL_KERNEL_STANDIN_CALLED"
CONTEXT_LENGTH = 2048
MAX_TOTAL_TOKENS = 65536
#: The server flags of the CPU profile; the node gets them through ``--sglang-arg``.
CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-overlap-schedule",
    "--sleep-on-idle",
    "--max-total-tokens",
    str(MAX_TOTAL_TOKENS),
    "--context-length",
    str(CONTEXT_LENGTH),
)
READY_LINE = "The server is fired up and ready to roll!"
START_TIMEOUT = 300.0
#: What a start-up log shows when a port SGLang picked for itself was taken before its child bound
#: it: the scheduler's torch-distributed store takes a random free port under the ephemeral range
#: (``get_free_port_below_ephemeral``), checks it, closes it and binds it again later. Seen once in
#: a full suite (port 28388): every contract test of that module failed on one unlucky pick.
PORT_CLASH = ("EADDRINUSE", "Address already in use")
T = TypeVar("T")


def other_models(python: Path | str) -> str:
    """Every model module of the venv's SGLang but ``qwen3``, comma-separated, for
    ``SGLANG_DISABLED_MODEL_ARCHS``: the registry then skips importing them (a quarter of the
    start-up here)."""
    found = sorted(Path(python).parent.parent.glob("lib/python*/site-packages/sglang/srt/models"))
    if not found:
        return ""
    names = (p.stem for p in found[0].glob("*.py"))
    return ",".join(sorted(n for n in names if n not in ("qwen3", "registry", "__init__")))


def cpu_env(base: Mapping[str, str], python: Path | str = "") -> dict[str, str]:
    """``base`` plus the CPU engine's environment and the stand-in first on ``PYTHONPATH``; with
    the venv's ``python``, the registry skips the model modules other than ``qwen3``."""
    path = os.pathsep.join(p for p in (str(STANDIN), base.get("PYTHONPATH", "")) if p)
    skipped = {"SGLANG_DISABLED_MODEL_ARCHS": other_models(python)} if python else {}
    return {
        **base,
        **skipped,
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def server_argv(
    python: Path | str, model: Path | str, port: int, api_key: str = "", extra: Sequence[str] = ()
) -> list[str]:
    """``python -m sglang.launch_server`` with the CPU profile and the qwen3 reasoning parser."""
    argv = [str(python), "-m", "sglang.launch_server", "--model-path", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--reasoning-parser", "qwen3", "--enable-metrics"]
    argv += [*CPU_FLAGS, *(("--api-key", api_key) if api_key else ()), *extra]
    return argv


def standin_calls(log_text: str) -> list[str]:
    """The stand-in ops the server called, from its log (empty when none was)."""
    lines = log_text.splitlines()
    return [line.split(STANDIN_MARKER, 1)[1].strip() for line in lines if STANDIN_MARKER in line]


@dataclass
class RealServer:
    """One real SGLang server process (its own session, so that stopping it stops its children)."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    api_key: str = ""
    started_at: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Block until ``/health_generate`` answers 200; the seconds it took. Fails with the log's
        tail when the process exits or the time runs out."""
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"SGLang exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/health_generate", timeout=30).status_code == 200:
                    return time.monotonic() - self.started_at
            time.sleep(0.5)
        raise AssertionError(f"SGLang not ready after {timeout:.0f} s:\n{self.log_text()[-4000:]}")

    def port_clash(self) -> bool:
        """Does its log say it failed because a port it picked for itself was taken meanwhile?"""
        return any(mark in self.log_text() for mark in PORT_CLASH)

    def check_no_standin_calls(self) -> None:
        calls = standin_calls(self.log_text())
        assert not calls, f"SGLang called sgl_kernel ops the stand-in cannot run: {calls} (log: {self.log})"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_server(
    python: Path | str,
    model: Path | str,
    port: int,
    log: Path,
    api_key: str = "",
    extra: Sequence[str] = (),
    base_env: Mapping[str, str] | None = None,
) -> RealServer:
    """Start a server in the background (wait with :meth:`RealServer.wait_ready`)."""
    env = cpu_env(dict(os.environ) if base_env is None else base_env, python)
    out = open(log, "wb")  # noqa: SIM115 - the child holds it; closed with the process
    try:
        proc = subprocess.Popen(
            server_argv(python, model, port, api_key, extra),
            cwd=log.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        out.close()
    return RealServer(proc, port, log, api_key)


def start_ready(
    python: Path | str,
    model: Path | str,
    port: int,
    log: Path,
    wait: Callable[[RealServer], T],
    api_key: str = "",
    extra: Sequence[str] = (),
) -> tuple[RealServer, T]:
    """Start a server and ``wait`` for it (:meth:`RealServer.wait_ready`, say); started once more
    (the first log kept beside the new one, ``*.clash.log``) when it failed on a port clash, which
    is SGLang's pick, not our fault. A server that is not ready is stopped before the error rises."""
    server = start_server(python, model, port, log, api_key, extra)
    try:
        return server, _wait_or_stop(server, wait)
    except AssertionError:
        if not server.port_clash():
            raise
    log.replace(log.with_suffix(".clash.log"))
    server = start_server(python, model, port, log, api_key, extra)
    return server, _wait_or_stop(server, wait)


def _wait_or_stop(server: RealServer, wait: Callable[[RealServer], T]) -> T:
    try:
        return wait(server)
    except BaseException:
        server.stop()
        raise


@contextlib.contextmanager
def running_server(
    python: Path | str, model: Path | str, port: int, log: Path, api_key: str = "", extra: Sequence[str] = ()
) -> Iterator[RealServer]:
    """A ready server for the block; stopped afterwards, and failed if it called a stand-in op."""
    server, _ = start_ready(python, model, port, log, RealServer.wait_ready, api_key, extra)
    try:
        yield server
        server.check_no_standin_calls()
    finally:
        server.stop()
