"""Supervision of one node: per GPU, a server that must be healthy before its worker starts.

The loop (main thread) keeps each GPU slot moving through its states:

* ``waiting``: no server process; one starts when its restart delay has passed.
* ``starting``: the server runs but ``/health_generate`` has not answered 200 yet (SGLang loads
  the model and captures CUDA graphs); past ``start_timeout`` it is killed and restarted.
* ``ready``: healthy; the worker runs (and is restarted with backoff when it dies). A server
  that dies is restarted with backoff while its worker stays up: the worker's own health gate
  (:mod:`workers.flow.health`) re-queues its chunks and pauses consumption until the new server
  answers. A server that stays unhealthy for ``hang_restart`` seconds is killed and restarted.
* ``failed``: ``max_failures`` consecutive failures; the slot is given up (the node exits 1 when
  every slot is).

Shutdown (SIGTERM, SIGINT): workers get SIGTERM first (Celery's warm shutdown: running chunks
finish, reserved ones go back to the queue) and up to ``worker_stop_timeout`` to exit; then the
servers are stopped. A second signal skips the waiting. A worker killed at the timeout loses
nothing: its chunk leases expire and live workers re-queue them.
"""

from __future__ import annotations

import enum
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import requests

from dflash_tasks.core.exit_codes import ExitCode
from workers.node.launch import GpuPlan
from workers.node.procs import Backoff, Child, LogEcho, stop_all, wait_all


class State(enum.Enum):
    WAITING = "waiting"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    health_interval: float = 5.0
    start_timeout: float = 1800.0
    hang_restart: float = 600.0
    worker_stop_timeout: float = 600.0
    server_stop_timeout: float = 60.0
    max_failures: int = 5
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    echo: str = "all"  # all | workers | none


def http_probe(url: str) -> bool:
    try:
        return requests.get(url, timeout=(2.0, 30.0)).status_code == 200
    except requests.RequestException:
        return False


@dataclass(slots=True)
class Slot:
    plan: GpuPlan
    server: Child
    worker: Child
    state: State = State.WAITING
    next_server: float = 0.0
    next_worker: float = 0.0
    unhealthy_since: float | None = None
    probe: Future[bool] | None = None
    last_probe: float = -1e9
    worker_ready: bool = field(default=False)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


class Node:
    """Runs the plans until :meth:`request_stop`; returns the node's exit status from :meth:`run`."""

    def __init__(
        self,
        plans: Sequence[GpuPlan],
        log_dir: Path,
        config: SupervisorConfig,
        out: IO[str] = sys.stdout,
        probe: Callable[[str], bool] = http_probe,
    ) -> None:
        self.config = config
        self._out = out
        self._probe = probe
        self._print_lock = threading.RLock()  # re-entrant: signal handlers print too
        self._wake = threading.Event()
        self._stops = 0
        self._t0 = time.monotonic()
        self._announced = False
        self.slots: list[Slot] = []
        for plan in plans:
            server = Child(
                f"{plan.name}/server", plan.server_argv, plan.env, log_dir / f"{plan.name}-server.log"
            )
            worker = Child(
                f"{plan.name}/worker", plan.worker_argv, plan.env, log_dir / f"{plan.name}-worker.log"
            )
            server.backoff = Backoff(config.backoff_base, config.backoff_cap)
            worker.backoff = Backoff(config.backoff_base, config.backoff_cap)
            self.slots.append(Slot(plan, server, worker))
        self._echo = LogEcho(self._write, on_line=self._on_line)
        for slot in self.slots:
            for child, role in ((slot.server, "server"), (slot.worker, "worker")):
                shown = config.echo == "all" or (config.echo == "workers" and role == "worker")
                self._echo.follow(child.name, child.log_path, shown)
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.slots)), thread_name_prefix="node-probe")

    # --- messages and signals ------------------------------------------------------------------

    def say(self, message: str) -> None:
        self._write(f"[node] {time.strftime('%H:%M:%S')} {message}")

    def _write(self, line: str) -> None:
        with self._print_lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):  # stdout gone (closed terminal): logs are in the files
                pass

    def request_stop(self) -> None:
        """First call: orderly shutdown. Second: stop waiting for running chunks."""
        self._stops += 1
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stops > 0

    def _on_line(self, name: str, line: str) -> None:
        if not name.endswith("/worker") or " ready." not in line:
            return
        slot = next(s for s in self.slots if s.worker.name == name)
        slot.worker_ready = True
        self.say(f"{slot.plan.name}: worker ready {slot.worker.uptime():.1f}s after its start")
        live = [s for s in self.slots if s.state is not State.FAILED]
        if not self._announced and live and all(s.worker_ready for s in live):
            self._announced = True
            elapsed = time.monotonic() - self._t0
            self.say(f"node ready: {len(live)} GPU(s) serving after {elapsed:.1f}s")

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        self._echo.start()
        status = ExitCode.OK
        try:
            while not self.stopping:
                now = time.monotonic()
                for slot in self.slots:
                    self._step(slot, now)
                if all(s.state is State.FAILED for s in self.slots):
                    self.say("every GPU slot failed; stopping the node")
                    status = ExitCode.NOT_PASSED
                    break
                self._wake.wait(0.2)
        finally:
            self._shutdown()
        return status

    def _step(self, slot: Slot, now: float) -> None:
        if slot.state is State.FAILED:
            return
        server = slot.server
        code = server.exit_code()
        if code is not None:
            uptime = server.uptime()
            server.reap()
            slot.probe, slot.state, slot.unhealthy_since = None, State.WAITING, None
            delay = server.backoff.failed(uptime)
            if server.backoff.failures >= self.config.max_failures:
                self._give_up(slot, f"server exited {server.backoff.failures} times in a row")
                return
            slot.next_server = now + delay
            self.say(
                f"{slot.plan.name}: server exited with {describe_exit(code)} after {uptime:.0f}s; "
                f"restarting in {delay:.0f}s (its worker pauses meanwhile)"
            )
        if server.proc is None:
            if now >= slot.next_server:
                server.spawn()
                slot.state = State.STARTING
                self.say(
                    f"{slot.plan.name}: server started (pid {server.pid}, port {slot.plan.port}, "
                    f"CUDA_VISIBLE_DEVICES={slot.plan.gpu}); waiting for {slot.plan.health_url}"
                )
            return
        self._check_health(slot, now)
        if slot.state is State.READY:
            self._step_worker(slot, now)

    def _check_health(self, slot: Slot, now: float) -> None:
        server = slot.server
        if slot.probe is not None and slot.probe.done():
            healthy, slot.probe = slot.probe.result(), None
            if healthy:
                if slot.state is State.STARTING:
                    slot.state = State.READY
                    self.say(f"{slot.plan.name}: server healthy {server.uptime():.1f}s after its start")
                    if slot.worker.running():
                        self.say(
                            f"{slot.plan.name}: its worker, still running, resumes by itself (health gate)"
                        )
                elif slot.unhealthy_since is not None:
                    self.say(f"{slot.plan.name}: server healthy again")
                slot.unhealthy_since = None
            elif slot.state is State.READY:
                if slot.unhealthy_since is None:
                    slot.unhealthy_since = now
                    self.say(f"{slot.plan.name}: server unhealthy ({slot.plan.health_url} fails)")
                elif now - slot.unhealthy_since > self.config.hang_restart:
                    self.say(
                        f"{slot.plan.name}: server unhealthy for {self.config.hang_restart:.0f}s; killing it"
                    )
                    server.signal(signal.SIGKILL)
        if slot.state is State.STARTING and server.uptime() > self.config.start_timeout:
            self.say(
                f"{slot.plan.name}: server not healthy after {self.config.start_timeout:.0f}s; killing it"
            )
            server.signal(signal.SIGKILL)
            return
        interval = self.config.health_interval
        if slot.state is State.STARTING:
            interval = min(interval, 1.0)
        if slot.probe is None and now - slot.last_probe >= interval:
            slot.last_probe = now
            slot.probe = self._pool.submit(self._probe, slot.plan.health_url)

    def _step_worker(self, slot: Slot, now: float) -> None:
        worker = slot.worker
        code = worker.exit_code()
        if code is not None:
            uptime = worker.uptime()
            worker.reap()
            slot.worker_ready = False
            delay = worker.backoff.failed(uptime)
            if worker.backoff.failures >= self.config.max_failures:
                self._give_up(slot, f"worker exited {worker.backoff.failures} times in a row")
                return
            slot.next_worker = now + delay
            self.say(
                f"{slot.plan.name}: worker exited with {describe_exit(code)} after {uptime:.0f}s; "
                f"restarting in {delay:.0f}s"
            )
        if worker.proc is None and now >= slot.next_worker:
            worker.spawn()
            self.say(f"{slot.plan.name}: worker started (pid {worker.pid}, endpoint {slot.plan.endpoint})")

    def _give_up(self, slot: Slot, reason: str) -> None:
        slot.state = State.FAILED
        self.say(
            f"{slot.plan.name}: giving up ({reason}); see {slot.server.log_path} and {slot.worker.log_path}"
        )
        slot.worker.signal(signal.SIGTERM)
        slot.server.signal(signal.SIGTERM)

    # --- shutdown ------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        workers = [s.worker for s in self.slots if s.worker.running()]
        servers = [s.server for s in self.slots if s.server.running()]
        timeout = self.config.worker_stop_timeout
        self.say(
            f"stopping {len(workers)} worker(s) (running chunks finish, up to {timeout:.0f}s), then servers"
        )
        for worker in workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        left = workers
        while left and time.monotonic() < deadline and self._stops < 2:
            left = wait_all(left, min(30.0, deadline - time.monotonic()), lambda: self._stops >= 2)
            if left and self._stops < 2 and time.monotonic() < deadline:
                self.say(f"waiting for {', '.join(w.name for w in left)} to finish their chunks")
        for worker in left:
            self.say(f"{worker.name} still running; killing it (its chunks' leases expire and are re-queued)")
            worker.signal(signal.SIGKILL)
        wait_all(left, 10.0, lambda: False)
        # After a second signal the servers still get a few seconds; a third one cuts that short.
        grace = (
            self.config.server_stop_timeout if self._stops < 2 else min(5.0, self.config.server_stop_timeout)
        )
        stop_all(servers, grace, lambda: self._stops >= 3, self.say)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._echo.stop()
        self.say("stopped")
