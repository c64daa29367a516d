"""The fault schedule: a pure function of (seed, window, store, topology). Same seed, same schedule.

Each kind of fault comes back at a mean interval (at least once per run), at a stratified random
time, so faults overlap: a worker frozen while Redis restarts and its server answers 500s.
Targets are chosen among the nodes alive over the whole fault (the node kill and the node join
are scheduled first). Nothing here touches a process; :mod:`tests.chaos.nemeses` does.

The repair rounds (the continuations of cut thoughts, the regeneration of transient failures) run
once the job's first pass is stored, whenever faults let that be: a few faults of their own
(:attr:`Schedule.repair`) strike at offsets from the moment the producer starts its first round.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.config import HANG_S, LEASE_S, NodeSpec

WORKER_KILL = "worker_kill"
WORKER_TERM = "worker_term"
WORKER_PAUSE = "worker_pause"
NODE_KILL = "node_kill"
NODE_JOIN = "node_join"
PARTITION_REDIS = "partition_redis"
PARTITION_ALL = "partition_all"
REDIS_RESTART = "redis_restart_aof"
REDIS_RESTART_EMPTY = "redis_restart_empty"
REDIS_FLUSHALL = "redis_flushall"
SIM_FAULT = "sim_fault"
SIM_RESTART = "sim_restart"
STORE_FAIL = "store_fail"
PRODUCER_KILL = "producer_kill"

SIM_FAULT_KINDS = ("http_500", "http_503", "hang", "bad_json", "abort", "reset", "unhealthy")


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: start ``at`` seconds into the window, heal ``duration`` seconds later."""

    at: float
    kind: str
    target: str = ""  # a node (n2), a worker (n2/gpu2) or "" (Redis, the store, the producer)
    duration: float = 0.0  # 0: instantaneous (a kill), healed at once
    params: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    @property
    def end(self) -> float:
        return self.at + self.duration

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.kind} {self.target} {extra}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "target": self.target,
            "duration": self.duration,
            "params": dict(self.params),
        }


#: kind -> (mean seconds between two, (shortest, longest) duration; (0, 0): instantaneous)
RATES: dict[str, tuple[float, tuple[float, float]]] = {
    WORKER_KILL: (60.0, (0.0, 0.0)),
    WORKER_TERM: (120.0, (0.0, 0.0)),
    WORKER_PAUSE: (150.0, (3 * LEASE_S, 180.0)),
    SIM_FAULT: (30.0, (3.0, 12.0)),
    SIM_RESTART: (150.0, (0.0, 0.0)),
    REDIS_RESTART: (240.0, (0.0, 0.0)),
    REDIS_RESTART_EMPTY: (300.0, (0.0, 0.0)),
    REDIS_FLUSHALL: (300.0, (0.0, 0.0)),
    PARTITION_REDIS: (150.0, (8.0, 40.0)),
    PARTITION_ALL: (200.0, (8.0, 30.0)),
    STORE_FAIL: (150.0, (5.0, 20.0)),
    PRODUCER_KILL: (120.0, (1.0, 15.0)),  # duration: until the producer is re-run
}


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    window: float
    faults: tuple[Fault, ...]
    #: faults whose ``at`` counts from the moment the producer starts its first repair round
    repair: tuple[Fault, ...] = ()

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}

    def last_end(self) -> float:
        return max((f.end for f in self.faults), default=0.0)

    def max_overlap(self) -> int:
        """Most faults active at one moment (instantaneous ones count for a second)."""
        edges: list[tuple[float, int]] = []
        for f in self.faults:
            edges += [(f.at, 1), (f.at + max(f.duration, 1.0), -1)]
        best = now = 0
        for _, step in sorted(edges):
            now += step
            best = max(best, now)
        return best

    def lines(self) -> list[str]:
        rows = [f"fault schedule (seed {self.seed}, {len(self.faults)} faults over {self.window:.0f} s):"]
        for i, f in enumerate(self.faults):
            span = f"{f.duration:5.1f}s" if f.duration else "    - "
            rows.append(f"  #{i:<3} t={f.at:7.1f}s  for {span}  {f.describe()}")
        if self.repair:
            rows.append(f"repair-phase faults ({len(self.repair)}, from the producer's first repair round):")
        for i, f in enumerate(self.repair, len(self.faults)):
            span = f"{f.duration:5.1f}s" if f.duration else "    - "
            rows.append(f"  #{i:<3} +{f.at:6.1f}s  for {span}  {f.describe()}")
        return rows

    def to_json(self) -> str:
        return json.dumps(
            {"seed": self.seed, "window": self.window, "faults": [f.as_dict() for f in self.faults]}
        )


def build(seed: int, window: float, nodes: Sequence[NodeSpec], store: str = "local") -> Schedule:
    """The schedule of a run: deterministic in its arguments."""
    rng = random.Random(f"dflash-chaos/{seed}")
    joiner = next(n for n in nodes if n.joins)
    join_at = round(rng.uniform(0.15, 0.4) * window, 1)
    killable = [n for n in nodes if not n.joins and n.name != nodes[0].name]
    victim = rng.choice(killable)
    kill_at = round(rng.uniform(0.35, 0.6) * window, 1)
    faults = [
        # the producer, first killed while staging, then (re-run) while queuing
        Fault(
            0.0,
            PRODUCER_KILL,
            "",
            round(rng.uniform(0.5, 2.0), 1),
            (("phase", "staging"), ("after_staged", rng.randint(2, 40))),
        ),
        Fault(0.0, PRODUCER_KILL, "", round(rng.uniform(0.5, 2.0), 1), (("phase", "queuing"),)),
        Fault(join_at, NODE_JOIN, joiner.name),
        Fault(kill_at, NODE_KILL, victim.name),
    ]
    alive = _Alive(nodes, joiner.name, join_at, victim.name, kill_at)
    for kind, (every, (shortest, longest)) in RATES.items():
        if kind == PARTITION_ALL and store != "s3":
            continue  # a local store is a filesystem: there is no network path to it to cut
        count = max(1, round(window / every))
        for j in range(count):
            # stratified over [5%, 90%] of the window, so every part of the run gets its share
            at = round(window * (0.05 + 0.85 * (j + rng.random()) / count), 1)
            duration = 0.0
            if longest:
                duration = round(rng.uniform(shortest, max(shortest, min(longest, window / 3))), 1)
                duration = min(duration, max(1.0, round(window * 0.95 - at, 1)))
            fault = _fault(rng, kind, at, duration, alive)
            if fault is not None:
                faults.append(fault)
    faults.sort(key=lambda f: (f.at, f.kind, f.target))
    after = [n for n in nodes if n.name != victim.name]  # alive once the window is over
    return Schedule(seed, window, tuple(faults), repair_faults(seed, after))


#: the repair phase's faults: (kind, (shortest, longest) duration), each once per run
REPAIR_FAULTS: tuple[tuple[str, tuple[float, float]], ...] = (
    (PRODUCER_KILL, (1.0, 5.0)),  # its re-run must not queue a round that runs or is stored
    (REDIS_RESTART_EMPTY, (0.0, 0.0)),  # rounds in flight forgotten: the producer re-plans them
    (WORKER_PAUSE, (3 * LEASE_S, 5 * LEASE_S)),  # wakes after its round was taken over
    (WORKER_KILL, (0.0, 0.0)),
    (SIM_FAULT, (3.0, 8.0)),  # continuations answered with 5xx, hangs, aborts, resets
    (STORE_FAIL, (3.0, 8.0)),  # round files cannot be written
    (PARTITION_REDIS, (8.0, 15.0)),  # a node runs its round cut off from Redis (split brain)
)


def repair_faults(seed: int, nodes: Sequence[NodeSpec]) -> tuple[Fault, ...]:
    """One fault of each :data:`REPAIR_FAULTS` kind, 0.5 to 3 s after the producer starts its first
    repair round (it publishes the round a second later), on nodes alive after the window."""
    rng = random.Random(f"dflash-chaos/{seed}/repair")
    alive = _Alive(nodes, "", 0.0, "", float("inf"))
    faults = []
    for kind, (shortest, longest) in REPAIR_FAULTS:
        at = round(rng.uniform(0.5, 3.0), 1)
        duration = round(rng.uniform(shortest, longest), 1) if longest else 0.0
        fault = _fault(rng, kind, at, duration, alive)
        if fault is not None:
            faults.append(fault)
    faults.sort(key=lambda f: (f.at, f.kind, f.target))
    return tuple(faults)


class _Alive:
    """Which nodes run over a span of the window, given the scheduled join and kill."""

    def __init__(
        self, nodes: Sequence[NodeSpec], joiner: str, join_at: float, victim: str, kill_at: float
    ) -> None:
        self.nodes = nodes
        self.joiner, self.join_at = joiner, join_at + 15.0  # give it time to start
        self.victim, self.kill_at = victim, kill_at

    def over(self, start: float, end: float) -> list[NodeSpec]:
        return [
            n
            for n in self.nodes
            if not (n.name == self.joiner and start < self.join_at)
            and not (n.name == self.victim and end + 1.0 >= self.kill_at)
        ]


def _fault(rng: random.Random, kind: str, at: float, duration: float, alive: _Alive) -> Fault | None:
    nodes = alive.over(at, at + duration)
    if kind in (WORKER_KILL, WORKER_TERM, WORKER_PAUSE, SIM_FAULT, SIM_RESTART):
        node = rng.choice(nodes)
        target = f"{node.name}/{rng.choice(node.workers)}"
        if kind != SIM_FAULT:
            return Fault(at, kind, target, duration)
        what = rng.choice(SIM_FAULT_KINDS)
        params: list[tuple[str, Any]] = [("fault", what)]
        if what == "hang":
            params += [("count", rng.randint(2, 6)), ("hang_seconds", HANG_S)]
            return Fault(at, kind, target, HANG_S, tuple(params))
        if what == "unhealthy" or rng.random() < 0.5:
            params.append(("seconds", duration))
            return Fault(at, kind, target, duration, tuple(params))
        params.append(("count", rng.randint(3, 12)))
        return Fault(at, kind, target, 0.0, tuple(params))
    if kind in (PARTITION_REDIS, PARTITION_ALL):
        cut = [n for n in nodes if n.netns]
        if not cut:
            return None
        return Fault(at, kind, rng.choice(cut).name, duration)
    if kind == PRODUCER_KILL:
        return Fault(at, kind, "", duration, (("phase", "any"),))
    return Fault(at, kind, "", duration)


def overlapping(faults: Iterable[Fault], at: float) -> list[Fault]:
    """The faults active at ``at``."""
    return [f for f in faults if f.at <= at <= f.at + max(f.duration, 1.0)]
