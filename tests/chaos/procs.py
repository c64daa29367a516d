"""Processes of a chaos run, found again at the end to prove that nothing was left behind.

Every process the run starts has its working directory inside the run folder (children inherit
it) and ``CHAOS_RUN=<id>`` in its environment. The working directory is what counts: Celery and
Redis retitle their processes over the memory ``/proc/PID/environ`` shows, so the variable
cannot be read back from them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "CHAOS_RUN"


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    state: str
    argv: tuple[str, ...]

    def has(self, *words: str) -> bool:
        return all(w in self.argv for w in words)

    @property
    def line(self) -> str:
        return " ".join(self.argv)


def read_proc(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after its last ')'
    rest = stat.rsplit(")", 1)[1].split()
    return ProcInfo(pid, int(rest[1]), rest[0], tuple(a.decode(errors="replace") for a in argv if a))


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def children(pid: int) -> list[ProcInfo]:
    found = []
    for other in all_pids():
        info = read_proc(other)
        if info is not None and info.ppid == pid:
            found.append(info)
    return found


def descendants(pid: int) -> list[ProcInfo]:
    table = [i for i in (read_proc(p) for p in all_pids()) if i is not None]
    by_parent: dict[int, list[ProcInfo]] = {}
    for info in table:
        by_parent.setdefault(info.ppid, []).append(info)
    out: list[ProcInfo] = []
    todo = [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def marked(run_id: str, folder: Path) -> list[ProcInfo]:
    """Live processes (zombies excluded) working inside ``folder`` or with ``CHAOS_RUN=run_id``."""
    needle = f"{MARKER}={run_id}".encode()
    inside = str(folder.resolve())
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        mine = cwd == inside or cwd.startswith(inside + "/")
        if not mine:
            try:
                mine = needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
        if mine:
            info = read_proc(pid)
            if info is not None and info.state != "Z":
                found.append(info)
    return found


def send(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def kill_tree(pid: int) -> list[int]:
    """Freeze ``pid`` (so it restarts nothing), SIGKILL its descendants and their groups, then it."""
    send(pid, signal.SIGSTOP)
    tree = descendants(pid)
    for info in tree:
        send(info.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(info.pid, signal.SIGKILL)  # children lead their own groups (helpers)
    send(pid, signal.SIGKILL)
    return [pid, *(i.pid for i in tree)]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in left if (i := read_proc(p)) is not None and i.state != "Z"]
        if left:
            time.sleep(0.1)
    return left
