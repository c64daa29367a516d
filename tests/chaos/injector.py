"""Starting and healing a run's faults when the agenda says, each recorded in the history."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.chaos import schedule as S
from tests.chaos.agenda import Agenda
from tests.chaos.cluster import Node
from tests.chaos.history import History, Recorder
from tests.chaos.nemeses import Nemesis, Skip, World, nemeses

#: faults whose victims are the chunks held by the target's workers when it strikes
_WORKER_FAULTS = {S.WORKER_KILL, S.WORKER_TERM, S.WORKER_PAUSE, S.SIM_RESTART}
_NODE_FAULTS = {S.NODE_KILL, S.PARTITION_REDIS, S.PARTITION_ALL}


class Injector:
    """The window's faults at their times; the repair phase's from the producer's first round."""

    def __init__(
        self,
        schedule: S.Schedule,
        history: History,
        recorder: Recorder,
        world: World,
        nodes: dict[str, Node],
        say: Callable[[str], None],
    ) -> None:
        self.schedule = schedule
        self.agenda = Agenda(schedule.faults)
        self.table = nemeses()
        self.started: set[int] = set()
        self.h = history
        self.recorder = recorder
        self.world = world
        self.nodes = nodes
        self.say = say

    def window_left(self) -> bool:
        return self.agenda.window_left()

    def arm_repair_phase(self) -> None:
        """The producer started a repair round: put the repair phase's faults on the agenda (once)."""
        if self.agenda.armed is None and self.schedule.repair:
            self.agenda.arm(self.schedule.repair, self.h.now())
            self.h.record("repair_faults_armed", count=len(self.schedule.repair))

    def advance(self) -> None:
        """Start and heal the faults that are due."""
        for step in self.agenda.due(self.h.now()):
            if step.start:
                self._start(step.index, step.fault)
                if not step.fault.duration and step.index in self.started:
                    self.recorder.healed(step.index)
            elif step.index in self.started:
                self._stop(step.index, step.fault)

    def heal_repair_phase(self) -> None:
        """Heal the repair phase's faults in effect now."""
        for step in self.agenda.take(start=False):
            if step.index in self.started:
                self._stop(step.index, step.fault)

    def end_repair_phase(self, why: str = "the repair rounds were over") -> None:
        """The job is done: heal the repair phase's faults still in effect, skip those to come."""
        self.heal_repair_phase()
        if self.agenda.armed is None:
            why = "no repair round ran"
            self.agenda.arm(self.schedule.repair, self.h.now())
        for step in self.agenda.take(start=True):
            f = step.fault
            self.h.record("fault_skipped", index=step.index, kind=f.kind, target=f.target, why=why)
            self.say(f"[{self.h.now():7.1f}s] #{step.index} {f.describe()}: skipped ({why})")

    def _start(self, i: int, f: S.Fault) -> None:
        nemesis: Nemesis = self.table[f.kind]
        try:
            watch = self.recorder.watch(i, f.kind, self._victim_workers(f)) if f.kind != S.NODE_JOIN else None
            detail = nemesis.start(i, f, self.world)
        except Skip as why:
            if watch is not None:
                self.recorder.watches.remove(watch)
            self.h.record("fault_skipped", index=i, kind=f.kind, target=f.target, why=str(why))
            self.say(f"[{self.h.now():7.1f}s] #{i} {f.describe()}: skipped ({why})")
            return
        self.started.add(i)
        self.h.record("fault_start", index=i, kind=f.kind, target=f.target, detail=detail)
        self.say(f"[{self.h.now():7.1f}s] #{i} {f.describe()} {_short(detail)}")

    def _stop(self, i: int, f: S.Fault) -> None:
        try:
            detail = self.table[f.kind].stop(i, f, self.world)
        except Exception as exc:  # a heal that fails is retried by heal_all
            detail = {"error": f"{type(exc).__name__}: {exc}"}
        self.recorder.healed(i)
        self.h.record("fault_stop", index=i, kind=f.kind, target=f.target, detail=detail)
        self.say(f"[{self.h.now():7.1f}s] #{i} healed: {f.kind} {f.target}")

    def _victim_workers(self, f: S.Fault) -> list[str]:
        if f.kind in _WORKER_FAULTS:
            return [f.target.split("/")[1]]
        if f.kind in _NODE_FAULTS:
            return list(self.nodes[f.target].spec.workers)
        return []


def _short(detail: dict[str, Any]) -> str:
    text = json.dumps(detail, default=str)
    return "" if text == "{}" else (text if len(text) < 100 else text[:97] + "...")
