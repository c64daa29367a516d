"""The system under test: simulated GPU nodes (``python -m workers.node --simulate``) and the producer.

A node runs on the host or inside its own network namespace (``ip netns exec``); its workers
reach Redis (and an S3 store) over its link, its simulators answer the run on the ``ctl`` path.
The producer is ``python -m dflash_tasks.enqueue ... --wait`` on the host, re-run as an operator
(or systemd) would when it stops without finishing the job.
"""

from __future__ import annotations

import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.chaos import procs
from tests.chaos.config import INFLIGHT, MODEL, SIM_FLAGS, TRAIN_MAX_LENGTH, NodeSpec
from tests.chaos.netns import Link
from tests.chaos.services import Output, RedisProc
from tests.helpers import free_port

_READY = "node ready:"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Node:
    """One simulated GPU node: a supervisor, and per GPU a simulator and a worker."""

    def __init__(
        self,
        spec: NodeSpec,
        link: Link | None,
        folder: Path,
        env: dict[str, str],
        redis: RedisProc,
        output: Output,
        sim_flags: tuple[str, ...] = SIM_FLAGS,
    ) -> None:
        self.spec = spec
        self.sim_flags = sim_flags
        self.link = link
        self.folder = folder / spec.name
        self.env = env
        self.redis = redis
        self.output = output
        self.port_base = self._pick_ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False
        self.terminated = False
        self.started_at: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def _pick_ports(self) -> int:
        low = min(self.spec.gpus)
        for _ in range(50):
            base = free_port() - low
            if base > 1024 and all(_port_free(base + g) for g in self.spec.gpus):
                return base
        raise RuntimeError(f"no free ports for node {self.spec.name}")

    def sim_url(self, gpu: int) -> str:
        host = self.link.ns_ip("ctl") if self.link else "127.0.0.1"
        return f"http://{host}:{self.port_base + gpu}"

    def gpu_of(self, worker: str) -> int:
        return self.spec.gpus[self.spec.workers.index(worker)]

    def argv(self) -> list[str]:
        sim = list(self.sim_flags)
        if self.link is not None:  # the namespace has only loopback and its link: the run reads stats
            sim += ["--host", "0.0.0.0"]
        argv = [
            sys.executable,
            "-m",
            "workers.node",
            "--simulate",
            *("--gpus", ",".join(str(g) for g in self.spec.gpus)),
            *("--port-base", str(self.port_base)),
            *("--max-inflight", str(INFLIGHT)),
            *("--log-dir", str(self.folder)),
            *("--echo", "none"),
            *("--health-interval-seconds", "0.5"),
            *("--max-failures", "1000"),
            *("--restart-delay-seconds", "1"),
            *("--worker-stop-timeout-seconds", "60"),
            *("--server-stop-timeout-seconds", "10"),
            *("--hang-restart-seconds", "60"),
            *("--sim-arg", shlex.join(sim)),
        ]
        return (self.link.exec_prefix() if self.link else []) + argv

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        address = self.link.host_ip("redis") if self.link else "127.0.0.1"
        store_side = self.link.host_ip("store") if self.link else None
        env = {**self.env, "DFLASH_BROKER_URL": self.redis.url(address), **self.output.env(store_side)}
        with open(self.folder / "node.log", "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=self.folder,  # inherited by its children: how the run finds them all at the end
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def ready(self) -> bool:
        try:
            return _READY in (self.folder / "node.log").read_text(errors="replace")
        except FileNotFoundError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self.killed

    def worker_pid(self, worker: str) -> int | None:
        # Celery retitles its process: "[celeryd: gpu2@host:MainProcess] ..."
        return self._child(lambda i: i.has("workers", "--name", worker) or f"celeryd: {worker}@" in i.line)

    def sim_pid(self, gpu: int) -> int | None:
        return self._child(lambda i: i.has("dflash_tasks.sim", "--port", str(self.port_base + gpu)))

    def _child(self, match: Callable[[procs.ProcInfo], bool]) -> int | None:
        if not self.alive():
            return None
        assert self.proc is not None
        for info in procs.children(self.proc.pid):
            if info.state != "Z" and match(info):
                return info.pid
        return None

    def kill(self) -> list[int]:
        """The machine is lost: every process of the node SIGKILLed at once."""
        self.killed = True
        if self.proc is None:
            return []
        pids = procs.kill_tree(self.proc.pid)
        self.proc.wait(30)
        return pids

    def terminate(self) -> None:
        """SIGTERM, once: a second one tells the supervisor to stop waiting for running chunks."""
        if self.proc is not None and self.proc.poll() is None and not self.terminated:
            self.proc.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self, timeout: float = 90.0) -> bool:
        """SIGTERM (warm shutdown of the workers, then the servers); False if it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        self.terminate()
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            procs.kill_tree(self.proc.pid)
            self.proc.wait(30)
            return False


class Producer:
    """``enqueue --wait`` on the host: started, killed, held back and re-run by the schedule."""

    def __init__(
        self, folder: Path, env: dict[str, str], inp: Path, output: Output, chunk_size: int, max_tokens: int
    ) -> None:
        self.log = folder / "producer.log"
        self.env = {**env, **output.env(None)}
        self.inp = inp
        self.output = output
        self.chunk_size = chunk_size
        self.max_tokens = max_tokens
        self._read = 0  # how much of the log tick() has looked through for repair rounds
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.held_until: float | None = None  # killed by the schedule; re-run at this time
        self.done = False
        self.exits: list[tuple[float, int]] = []  # (monotonic time, exit status) of runs that ended

    def argv(self) -> list[str]:
        from dflash_tasks.core.quality import CHECKS

        shares = [a for c in CHECKS for a in ("--max-share", f"{c}=1")]  # chaos, not quality gates
        return [
            sys.executable,
            "-m",
            "dflash_tasks.enqueue",
            *("--input", str(self.inp), "--output", self.output.uri, "--model", MODEL),
            *("--chunk-size", str(self.chunk_size), "--no-preflight", "--json", *shares),
            # thoughts cut short of the trainer's horizon: the repair rounds continue them
            *("--max-tokens", str(self.max_tokens), "--train-max-length", str(TRAIN_MAX_LENGTH)),
            *("--wait", "--wait-replan-seconds", "3"),
        ]

    def start(self) -> None:
        self.runs += 1
        self.held_until = None
        with open(self.log, "ab") as log:
            log.write(f"\n=== run {self.runs} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=self.log.parent,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rerun(self) -> None:
        """Run it once more after it finished (the operator's answer to "N samples left")."""
        self.done = False
        self.start()

    def repair_rounds(self) -> list[str]:
        """The lines it wrote since the last call that start a repair round ("repair round 2 of ...")."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._read)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines only: the rest is read next time
        self._read += end
        lines = data[:end].decode(errors="replace").replace("\r", "\n").splitlines()
        return [line.strip() for line in lines if line.strip().startswith("repair round ")]

    def kill(self, hold_s: float) -> bool:
        """SIGKILL it (if it runs) and re-run it ``hold_s`` seconds later; True if it was running."""
        was = self.running()
        if self.proc is not None:
            procs.kill_tree(self.proc.pid)
            self.proc.wait(30)
            self._reap()
        self.held_until = time.monotonic() + hold_s
        return was

    def _reap(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append((time.monotonic(), int(self.proc.returncode)))
            if self.proc.returncode == 0:
                self.done = True
            self.proc = None

    def tick(self) -> str:
        """Re-run when due (after a kill) or after an exit other than success; '' or what it did."""
        if self.proc is not None and self.proc.poll() is not None:
            rc = int(self.proc.returncode)
            self._reap()
            if rc == 0:
                return "producer finished: the job is done"
            self.held_until = time.monotonic() + 2.0  # as an operator or systemd would
            return f"producer exited with status {rc}; re-run in 2 s"
        due = self.held_until is not None and time.monotonic() >= self.held_until
        if self.proc is None and not self.done and due:
            self.start()
            return f"producer re-run (run {self.runs}, --wait)"
        return ""
