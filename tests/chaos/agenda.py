"""When each fault of a run starts and heals: the window's at their times, the repair phase's once
it begins (:attr:`tests.chaos.schedule.Schedule.repair`)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.chaos.schedule import Fault


@dataclass(frozen=True, order=True)
class Step:
    """Start (``start`` 1) or heal (0: a heal goes before a start at the same time) fault ``index``."""

    at: float
    start: int
    index: int
    fault: Fault = field(compare=False)


class Agenda:
    """The steps not taken yet, soonest first."""

    def __init__(self, window: Iterable[Fault]) -> None:
        self.steps: list[Step] = []
        self.window = 0  # the window's faults are 0 .. window-1; the repair phase's follow
        for i, f in enumerate(window):
            self._add(f.at, i, f)
            self.window = i + 1
        self.armed: float | None = None  # when the repair phase's faults were put on the agenda

    def _add(self, at: float, index: int, fault: Fault) -> None:
        heapq.heappush(self.steps, Step(at, 1, index, fault))
        if fault.duration:
            heapq.heappush(self.steps, Step(at + fault.duration, 0, index, fault))

    def arm(self, repair: Iterable[Fault], now: float) -> None:
        """Put the repair phase's faults on the agenda, counted from ``now`` (once)."""
        if self.armed is not None:
            return
        self.armed = now
        for i, f in enumerate(repair, self.window):
            self._add(now + f.at, i, f)

    def due(self, now: float) -> list[Step]:
        """The steps due by ``now``, in order (taken off the agenda)."""
        out = []
        while self.steps and self.steps[0].at <= now:
            out.append(heapq.heappop(self.steps))
        return out

    def window_left(self) -> bool:
        """Whether a step of the window's faults is still to come."""
        return any(s.index < self.window for s in self.steps)

    def take(self, start: bool) -> list[Step]:
        """Take every start (``start``) or every heal off the agenda, in order."""
        taken = sorted(s for s in self.steps if s.start == int(start))
        self.steps = [s for s in self.steps if s.start != int(start)]
        heapq.heapify(self.steps)
        return taken
