"""What the demo starts and waits on: its child processes, free ports, Redis, the job's page."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import MonitorSettings
from workers.node.main import port_in_use
from workers.node.procs import Child, stop_all

FLOWER_USER = "admin"


class Children:
    """What the demo started: the node, Flower, and the enqueue and verify commands in turn."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Child] = []

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        child = Child(name, tuple(argv), env, self.logs / f"{name}.log")
        child.spawn()
        self.started.append(child)
        return child

    def foreground(self, argv: Sequence[str]) -> int:
        """Run ``argv`` on our terminal (its progress bar shows live) and return its exit status."""
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()

    def stop_all(self, timeout: float) -> None:
        """Flower, then the node (which stops its workers before its simulators)."""
        for child in reversed(self.started):
            try:
                stop_all([child], timeout, lambda: False, say)
            except KeyboardInterrupt:
                child.signal(signal.SIGKILL)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for_log(child: Child, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
    """Wait until ``child``'s log matches ``pattern``; raise DemoError if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        found = pattern.search(child.log_path.read_text(errors="replace"))
        if found:
            return found
        if not child.running():
            raise DemoError(f"{child.name} exited with status {child.exit_code()}:\n{_tail(child.log_path)}")
        if time.monotonic() > deadline:
            raise DemoError(f"{child.name} not ready after {timeout:.0f}s (log: {child.log_path})")
        time.sleep(0.1)


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


class Terminated(Exception):
    """SIGTERM or SIGHUP arrived."""


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


# --- the prompt file ---------------------------------------------------------------------------


# --- ports, Redis and the page ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_range(count: int) -> int:
    """A base port B with B .. B+count-1 all free on 127.0.0.1."""
    for _ in range(100):
        base = free_port()
        if base + count < 65536 and all(not port_in_use(base + i) for i in range(count)):
            return base
    raise DemoError(f"no run of {count} free ports found on 127.0.0.1")


def wait_port(port: int, child: Child, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.running():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def check_redis(url: str) -> None:
    """Raise DemoError unless Redis answers at ``url``."""
    from dflash_tasks.coord.connection import ping

    try:
        ping(url, timeout=3)
    except RetryableError as exc:
        reason = exc.__cause__ or exc  # redis-py's own words, as before
        raise DemoError(f"no Redis at {redact_url(url)} ({reason}); `make redis` starts one") from None


def say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def start_page(
    children: Children, completions: Path, port: int, settings: MonitorSettings, env: dict[str, str]
) -> None:
    """Start the job's page once enqueue has staged the job (job.json exists) and print its address."""
    deadline = time.monotonic() + 600
    while not (completions / "job.json").exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    given = settings.page_basic_auth
    auth = given or f"{FLOWER_USER}:{secrets.token_urlsafe(12)}"
    page_env = {**env, "DFLASH_PAGE_BASIC_AUTH": auth}  # not on the command line
    argv = [sys.executable, "-m", "dflash_tasks.page", "--output", str(completions), "--port", str(port)]
    page = children.spawn("page", argv, page_env)
    user, _, password = auth.partition(":")
    shown = "from DFLASH_PAGE_BASIC_AUTH" if given else password
    if wait_port(port, page, 20.0):
        say(f"the job's page: http://127.0.0.1:{port}/  user {user}  password {shown}")
    else:
        say(f"the job's page did not come up (see {page.log_path})")


def watch_children(children: Sequence[Child]) -> None:
    reported: set[str] = set()
    while True:
        for child in children:
            if not child.running() and child.name not in reported:
                reported.add(child.name)
                say(f"{child.name} exited with status {child.exit_code()} (log: {child.log_path})")
        time.sleep(1.0)
