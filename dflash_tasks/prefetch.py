"""Taking the next chunk when the request backlog runs low, not when a chunk ends.

A chunk ends only when its slowest request ends; with long-tailed output lengths the other
slots would drain long before. So a worker takes another chunk as soon as fewer than
``low_water`` requests wait for a slot, up to ``max_chunks`` held at once, by moving the
consumer's prefetch count (with ``acks_late`` every held chunk is one unacked message).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def prefetch_target(held: int, backlog: int, low_water: int, max_chunks: int) -> int:
    """How many chunks the worker should hold now."""
    want = held + (1 if backlog < low_water else 0)
    return max(1, min(max_chunks, want))


class PrefetchController:
    """Adjusts the consumer's QoS from a small background loop."""

    def __init__(
        self,
        held: Callable[[], int],
        backlog: Callable[[], int],
        low_water: int,
        max_chunks: int,
        interval: float = 0.1,
    ) -> None:
        self._held = held
        self._backlog = backlog
        self._low_water = low_water
        self._max = max_chunks
        self._interval = interval
        self._qos: Any = None
        self._current = 0
        self._stop = threading.Event()

    def attach(self, qos: Any) -> None:
        """Take over the consumer's QoS (called by the consumer bootstep before consuming starts)."""
        self._qos = qos
        self.tick()

    def tick(self) -> int:
        target = prefetch_target(self._held(), self._backlog(), self._low_water, self._max)
        if self._qos is not None and target != self._current:
            self._qos.set(target)
            self._current = target
        return target

    def start(self) -> None:
        threading.Thread(target=self._run, name="dflash-prefetch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.tick()
            except Exception:
                log.exception("prefetch adjustment failed")
