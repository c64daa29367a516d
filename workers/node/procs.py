"""Child processes of a node: spawning with a log file, signalling, restart backoff, log echo.

Each child leads its own process group (so a Ctrl-C on the node's terminal reaches only the
node, which then stops its children in order) and, on Linux, gets SIGTERM when the node dies
(``PR_SET_PDEATHSIG``), so a killed node leaves no server holding its GPU and port.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:  # runs in the child between fork and exec: keep it tiny
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


@dataclass(slots=True)
class Backoff:
    """Restart delays: ``base``, doubling per consecutive failure, up to ``cap`` seconds.

    A child that ran at least ``stable_after`` seconds before failing starts again from
    ``base``; ``failures`` counts the consecutive failures since the last stable run.
    """

    base: float = 1.0
    cap: float = 60.0
    stable_after: float = 60.0
    failures: int = 0

    def failed(self, uptime: float) -> float:
        """Record a failure after ``uptime`` seconds; return the delay before the next start."""
        if uptime >= self.stable_after:
            self.failures = 0
        self.failures += 1
        return float(min(self.cap, self.base * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


@dataclass(slots=True)
class Child:
    """One supervised process (a server or a worker); ``spawn`` may be called again after it exits."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    starts: int = 0
    backoff: Backoff = field(default_factory=Backoff)

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        secrets = secret_values(self.argv)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(
                f"=== {stamp} node: start #{self.starts}: {' '.join(redact_argv(self.argv))}\n".encode()
            )
            log.flush()
            self.proc = subprocess.Popen(
                list(self.argv),
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                # SGLang logs its server_args, the API key in plain text: such a child's output
                # goes through a pipe that masks the key before it reaches the log file
                stdout=subprocess.PIPE if secrets else log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if _prctl is not None else None,
            )
        if secrets and self.proc.stdout is not None:
            threading.Thread(
                target=_copy_masked,
                args=(self.proc.stdout, self.log_path, secrets),
                name=f"node-log-{self.name}",
                daemon=True,
            ).start()
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        """The exit status once the process ended (negative: killed by that signal), else None."""
        return self.proc.poll() if self.proc is not None else None

    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child's whole process group (SGLang has helper processes)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def reap(self) -> None:
        """Forget an exited process (after its exit was handled)."""
        self.proc = None


def wait_all(children: Sequence[Child], timeout: float, stop_early: Callable[[], bool]) -> list[Child]:
    """Wait until every child exited, ``timeout`` passed or ``stop_early()``; return those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = [c for c in children if c.running()]
        if not left or time.monotonic() >= deadline or stop_early():
            return left
        time.sleep(0.1)


def stop_all(
    children: Sequence[Child], timeout: float, stop_early: Callable[[], bool], say: Callable[[str], None]
) -> None:
    """SIGTERM each child's group, wait up to ``timeout`` s, then SIGKILL whatever is left."""
    for child in children:
        child.signal(signal.SIGTERM)
    left = wait_all(children, timeout, stop_early)
    for child in left:
        say(f"{child.name} still running after SIGTERM; killing it")
        child.signal(signal.SIGKILL)
    wait_all(left, 10.0, lambda: False)


@dataclass(slots=True)
class _Followed:
    prefix: str
    path: Path
    offset: int = 0
    partial: bytes = b""


class LogEcho:
    """Copies new lines of the children's log files to ``write``, prefixed with the child's name.

    One thread polls every file; ``on_line(name, line)`` sees every line (echoed or not).
    """

    def __init__(
        self,
        write: Callable[[str], None],
        on_line: Callable[[str, str], None] | None = None,
        interval: float = 0.2,
    ) -> None:
        self._write = write
        self._on_line = on_line
        self._interval = interval
        self._files: dict[str, tuple[_Followed, bool]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-log-echo", daemon=True)

    def follow(self, name: str, path: Path, echo: bool) -> None:
        """Start following ``path`` from its current end (earlier runs' lines are not repeated)."""
        size = path.stat().st_size if path.exists() else 0
        with self._lock:
            self._files.setdefault(name, (_Followed(name, path, size), echo))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            followed = list(self._files.values())
        for item, echo in followed:
            for line in self._read(item):
                if self._on_line is not None:
                    self._on_line(item.prefix, line)
                if echo:
                    self._write(f"[{item.prefix}] {line}")

    @staticmethod
    def _read(item: _Followed, limit: int = 1 << 20) -> list[str]:
        try:
            size = item.path.stat().st_size
            if size < item.offset:  # truncated (logrotate copytruncate): start over
                item.offset, item.partial = 0, b""
            if size == item.offset:
                return []
            with open(item.path, "rb") as fh:
                fh.seek(item.offset)
                data = fh.read(limit)
        except OSError:
            return []
        item.offset += len(data)
        *lines, item.partial = (item.partial + data).split(b"\n")
        if len(item.partial) > _MAX_PARTIAL:  # a progress bar redrawn with \r and no newline
            lines.append(item.partial)
            item.partial = b""
        # What a terminal would show: the last \r-separated redraw of each line.
        return [line.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode(errors="replace") for line in lines]


_MAX_PARTIAL = 64 * 1024


_SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})


def secret_values(argv: Sequence[str]) -> tuple[bytes, ...]:
    """The values of the secret flags in ``argv`` (``--api-key K`` or ``--api-key=K``)."""
    found = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and flag in _SECRET_FLAGS and value:
            found.append(value)
        elif arg in _SECRET_FLAGS and i + 1 < len(argv) and argv[i + 1]:
            found.append(argv[i + 1])
    return tuple(v.encode() for v in found)


def _copy_masked(pipe: IO[bytes], path: Path, secrets: Sequence[bytes]) -> None:
    """Append ``pipe``'s lines to ``path`` with every secret replaced by ``***``, until it closes."""
    with pipe, open(path, "ab", buffering=0) as log:
        for line in iter(pipe.readline, b""):
            for secret in secrets:
                line = line.replace(secret, b"***")
            log.write(line)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret flag (``--api-key K`` or ``--api-key=K``) masked."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            out.append("***")
        elif eq and flag in _SECRET_FLAGS:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
        hide_next = arg in _SECRET_FLAGS
    return out
