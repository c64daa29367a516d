"""Runtime fault injection: a thread-safe board of active faults with count or time limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dflash_tasks.sim.config import FaultSpec


@dataclass
class _Active:
    spec: FaultSpec
    remaining: int | None
    until: float | None

    def expired(self, now: float) -> bool:
        return (self.remaining is not None and self.remaining <= 0) or (
            self.until is not None and now >= self.until
        )


class FaultBoard:
    """Active faults, applied in installation order.

    Chat requests consume the first active chat fault (every kind but ``unhealthy``); health probes
    consume ``unhealthy`` faults.  A consumed ``count`` fault disappears after its N-th use.
    """

    def __init__(
        self, initial: Iterable[FaultSpec] = (), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._active: list[_Active] = []
        for spec in initial:
            self.add(spec)

    def add(self, spec: FaultSpec) -> None:
        """Install a fault; it starts counting (or its timer starts) now."""
        until = None if spec.seconds is None else self._clock() + spec.seconds
        with self._lock:
            self._active.append(_Active(spec, spec.count, until))

    def clear(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._active.clear()

    def take_chat(self) -> FaultSpec | None:
        """The fault to apply to the chat request arriving now, if any."""
        return self._take(lambda kind: kind != "unhealthy")

    def take_unhealthy(self) -> bool:
        """True when the health probe arriving now must answer 503."""
        return self._take(lambda kind: kind == "unhealthy") is not None

    def snapshot(self) -> list[dict[str, Any]]:
        """The active faults as JSON-ready dicts (``remaining`` count, ``seconds_left``)."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            return [
                {
                    "kind": a.spec.kind,
                    "remaining": a.remaining,
                    "seconds_left": None if a.until is None else round(a.until - now, 3),
                    "hang_seconds": a.spec.hang_seconds,
                }
                for a in self._active
            ]

    def _take(self, wanted: Callable[[str], bool]) -> FaultSpec | None:
        with self._lock:
            self._prune(self._clock())
            for active in self._active:
                if wanted(active.spec.kind):
                    if active.remaining is not None:
                        active.remaining -= 1
                    return active.spec
        return None

    def _prune(self, now: float) -> None:
        self._active = [a for a in self._active if not a.expired(now)]
