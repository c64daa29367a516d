"""The nemeses: one small class per kind of fault, each with ``start`` and ``stop``.

A nemesis acts on the :class:`World` (the run's processes, network and services) and returns
what it did, for the history. ``stop`` heals: it must be safe to call when ``start`` did nothing,
and the run heals every fault again (``heal_all``) before it waits for the job to finish.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from tests.chaos import schedule as S
from tests.chaos.cluster import Node, Producer
from tests.chaos.netns import NetLab
from tests.chaos.services import Output, RedisProc


@dataclass
class World:
    """Everything a nemesis may act on."""

    nodes: dict[str, Node]
    redis: RedisProc
    output: Output
    producer: Producer
    net: NetLab | None
    queue: str  # the broker list the job's chunk messages wait in
    bank_sim: Callable[[Node, int], None]  # read a simulator's counters before it is killed
    paused: dict[int, int] = field(default_factory=dict)  # fault index -> SIGSTOPped pid

    def node(self, target: str) -> Node:
        return self.nodes[target.split("/")[0]]


class Skip(Exception):
    """The fault could not be applied (its target is gone); recorded, not an error."""


class Nemesis:
    kind = ""

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        raise NotImplementedError

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        return {}


def _worker_pid(world: World, target: str, wait_s: float = 5.0) -> tuple[Node, str, int]:
    node = world.node(target)
    worker = target.split("/")[1]
    deadline = time.monotonic() + wait_s
    while True:
        if not node.alive():
            raise Skip(f"node {node.name} is not running")
        pid = node.worker_pid(worker)
        if pid is not None:
            return node, worker, pid
        if time.monotonic() >= deadline:
            raise Skip(f"{target}: no worker process (restarting)")
        time.sleep(0.2)


class WorkerSignal(Nemesis):
    """SIGKILL or SIGTERM one worker; its node's supervisor starts it again."""

    def __init__(self, kind: str, sig: signal.Signals) -> None:
        self.kind, self.sig = kind, sig

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        _, _, pid = _worker_pid(world, fault.target)
        os.kill(pid, self.sig)
        return {"pid": pid, "signal": self.sig.name}


class WorkerPause(Nemesis):
    """SIGSTOP a worker; SIGCONT it later: it wakes holding leases that expired meanwhile."""

    kind = S.WORKER_PAUSE

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        _, _, pid = _worker_pid(world, fault.target)
        os.kill(pid, signal.SIGSTOP)
        world.paused[index] = pid
        return {"pid": pid}

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        pid = world.paused.pop(index, None)
        if pid is None:
            return {}
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return {"pid": pid, "note": "gone before SIGCONT (its node was killed)"}
        return {"pid": pid}


class NodeKill(Nemesis):
    kind = S.NODE_KILL

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        node = world.node(fault.target)
        if not node.alive():
            raise Skip(f"node {node.name} is not running")
        for gpu in node.spec.gpus:
            world.bank_sim(node, gpu)
        return {"pids": node.kill()}


class NodeJoin(Nemesis):
    kind = S.NODE_JOIN

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        node = world.node(fault.target)
        node.start()
        return {"netns": node.link.netns if node.link else None}


class Partition(Nemesis):
    """Cut a namespaced node off Redis (split brain: it still reaches the store), or off both."""

    def __init__(self, kind: str, paths: tuple[str, ...]) -> None:
        self.kind, self.paths = kind, paths

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        if world.net is None:
            raise Skip("no network namespaces")
        node = world.node(fault.target)
        for path in self.paths:
            world.net.cut_path(node.name, path)
        return {"paths": list(self.paths)}

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        if world.net is not None:
            for path in self.paths:
                world.net.heal_path(fault.target, path)
        return {}


class RedisRestart(Nemesis):
    def __init__(self, kind: str, keep_data: bool) -> None:
        self.kind, self.keep = kind, keep_data

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        world.redis.restart(keep_data=self.keep)
        return {"aof": self.keep}


class RedisFlush(Nemesis):
    kind = S.REDIS_FLUSHALL

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        world.redis.flushall()
        return {}


class SimFault(Nemesis):
    """A fault of the SGLang simulator (``POST /sim/faults``): 500, 503, hang, bad JSON, abort, ..."""

    kind = S.SIM_FAULT

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        node = world.node(fault.target)
        if not node.alive():
            raise Skip(f"node {node.name} is not running")
        gpu = node.gpu_of(fault.target.split("/")[1])
        body: dict[str, Any] = {"kind": fault.param("fault")}
        for name in ("count", "seconds", "hang_seconds"):
            if fault.param(name) is not None:
                body[name] = fault.param(name)
        try:
            requests.post(f"{node.sim_url(gpu)}/sim/faults", json=body, timeout=3).raise_for_status()
        except requests.RequestException as exc:
            raise Skip(f"simulator {node.sim_url(gpu)} did not take the fault: {exc}") from None
        return body

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        return {}  # count and seconds faults expire by themselves


class SimRestart(Nemesis):
    """SIGKILL a simulator (the GPU's server); the node's supervisor starts it again."""

    kind = S.SIM_RESTART

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        node = world.node(fault.target)
        gpu = node.gpu_of(fault.target.split("/")[1])
        pid = node.sim_pid(gpu)
        if pid is None:
            raise Skip(f"{fault.target}: no simulator process")
        world.bank_sim(node, gpu)
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid}


class StoreFail(Nemesis):
    kind = S.STORE_FAIL

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        return {"how": world.output.fail()}

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        world.output.unfail()
        return {}


class ProducerKill(Nemesis):
    """SIGKILL the producer (at a moment, or once staging or queuing is under way); re-run later."""

    kind = S.PRODUCER_KILL

    def start(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        producer = world.producer
        phase = fault.param("phase", "any")
        if phase == "any":
            if producer.done:
                raise Skip("the producer already finished the job")
            return {"was_running": producer.kill(fault.duration)}
        if not producer.running():
            producer.start()
        seen = self._wait_for(phase, fault, world)
        producer.kill(fault.duration)
        return seen

    def _wait_for(self, phase: str, fault: S.Fault, world: World) -> dict[str, Any]:
        """Poll tightly until staging (some chunk inputs written) or queuing (messages sent) shows."""
        producer, out = world.producer, world.output
        deadline = time.monotonic() + 30  # never hold the rest of the schedule back for long
        client = world.redis.client()
        while time.monotonic() < deadline and producer.running():
            if phase == "staging":
                staged = out.count("inputs/")
                if staged >= int(fault.param("after_staged", 1)):
                    return {"staged_chunks": staged, "manifest": out.read("manifest.json") is not None}
            else:
                queued = int(client.llen(world.queue))
                if queued:
                    return {"queued_messages": queued}
            time.sleep(0.002)
        return {"note": f"{phase} was over before the kill (the producer had exited)"}

    def stop(self, index: int, fault: S.Fault, world: World) -> dict[str, Any]:
        if world.producer.held_until is not None and not world.producer.running():
            world.producer.start()
            return {"rerun": world.producer.runs}
        return {}


def nemeses() -> dict[str, Nemesis]:
    return {
        n.kind: n
        for n in (
            WorkerSignal(S.WORKER_KILL, signal.SIGKILL),
            WorkerSignal(S.WORKER_TERM, signal.SIGTERM),
            WorkerPause(),
            NodeKill(),
            NodeJoin(),
            Partition(S.PARTITION_REDIS, ("redis",)),
            Partition(S.PARTITION_ALL, ("redis", "store")),
            RedisRestart(S.REDIS_RESTART, True),
            RedisRestart(S.REDIS_RESTART_EMPTY, False),
            RedisFlush(),
            SimFault(),
            SimRestart(),
            StoreFail(),
            ProducerKill(),
        )
    }
