"""A chaos run's tear-down: stop the nodes as an operator would, then find what was left behind.

Every step runs whatever the others did; a step that fails is a problem of the run, as is any
process, namespace or link of the run still there at the end.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.chaos import procs
from tests.chaos.services import S3Output

if TYPE_CHECKING:
    from tests.chaos.runner import Run


def tear_down(run: Run) -> None:
    """Stop the recorder, heal, stop the nodes, Redis and the store, remove the namespaces; every
    problem goes to ``run.problems``."""
    steps: list[tuple[str, Callable[[], None]]] = [
        ("stopping the recorder", lambda: run.recorder.finish() if run.recorder else None),
        ("healing what is still broken", lambda: _heal_quietly(run)),
        ("stopping the nodes", lambda: _stop_nodes(run)),
        ("looking for processes left behind", lambda: _left_behind(run)),
        ("stopping Redis", lambda: run.redis.stop() if run.redis else None),
        ("closing the store", lambda: _close_output(run)),
        ("removing the namespaces", lambda: _remove_net(run)),
        ("looking for stray processes", lambda: _stray(run)),
    ]
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # tear everything down, whatever fails
            run.problems.append(f"{what} failed: {type(exc).__name__}: {exc}")
    if run.history is not None:
        run.history.close()


def _heal_quietly(run: Run) -> None:
    """After an interrupted run too: a partitioned or frozen worker would stall its node's stop."""
    if run.net is not None:
        run.net.heal_all()
    if run.output is not None:
        run.output.unfail()
    world = getattr(run, "world", None)
    for pid in world.paused.values() if world is not None else ():
        procs.send(pid, signal.SIGCONT)


def _stop_nodes(run: Run) -> None:
    running = [n for n in run.nodes.values() if n.proc is not None and n.proc.poll() is None]
    for node in running:  # all at once: each waits for its workers' running chunks
        node.terminate()
    for node in running:
        if not node.stop():
            run.problems.append(f"node {node.name} did not stop within 90 s of SIGTERM (killed)")
    if run.producer is not None and run.producer.running():
        run.producer.kill(0)


def _infra(run: Run) -> set[int]:
    infra = {run.redis.proc.pid} if run.redis and run.redis.proc else set()
    if isinstance(run.output, S3Output):
        infra.add(run.output.moto.proc.pid)
    return infra


def _left_behind(run: Run) -> None:
    infra = _infra(run)
    left = _settled(lambda: [p for p in procs.marked(run.run_id, run.dir) if p.pid not in infra], 1.0)
    if left:
        run.problems.append("processes left behind: " + "; ".join(f"{p.pid} {p.line[:80]}" for p in left[:5]))
        for p in left:
            procs.send(p.pid, signal.SIGKILL)


def _close_output(run: Run) -> None:
    if run.output is not None:
        run.problems.extend(run.output.close())


def _remove_net(run: Run) -> None:
    if run.net is not None:
        run.problems.extend(run.net.remove())
        leftovers = _settled(run.net.leftovers, 0.5)
        if leftovers:
            run.problems.append(f"namespaces or links left: {leftovers}")


def _stray(run: Run) -> None:
    stray = _settled(lambda: procs.marked(run.run_id, run.dir), 0.5)
    if stray:
        run.problems.append(f"{len(stray)} processes still running after the services stopped")
        for p in stray:
            procs.send(p.pid, signal.SIGKILL)


def _settled(probe: Callable[[], list[Any]], seconds: float) -> list[Any]:
    """What ``probe`` still finds after ``seconds`` (sooner once it finds nothing)."""
    deadline = time.monotonic() + seconds
    found = probe()
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = probe()
    return found
