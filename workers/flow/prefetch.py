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
    """Adjusts the consumer's QoS from a small background loop, and when a chunk ends.

    The new count is applied on the consumer's event loop (``hub.call_soon``), which also wakes
    the loop, so a wanted chunk is fetched within milliseconds. :meth:`nudge` runs as soon as a
    chunk is stored, before its message is acked: the ack must not pull in a chunk that the
    backlog does not call for.
    """

    def __init__(
        self,
        held: Callable[[], int],
        backlog: Callable[[], int],
        low_water: int | Callable[[], int],
        max_chunks: int,
        interval: float = 0.05,
    ) -> None:
        self._held = held
        self._backlog = backlog
        self._low_water = low_water
        self._max = max_chunks
        self._interval = interval
        self._qos: Any = None
        self._hub: Any = None
        self._stop = threading.Event()

    def attach(self, qos: Any, hub: Any = None) -> None:
        """Take over the consumer's QoS (called by the consumer bootstep before consuming starts).

        ``hub`` is the consumer's event loop (default: the current kombu event loop, if any).
        """
        if hub is None:
            from dflash_tasks.coord.celery_app import consumer_event_loop

            hub = consumer_event_loop()
        self._qos, self._hub = qos, hub
        self._apply(self.target())

    def target(self) -> int:
        """The prefetch count wanted now."""
        low = self._low_water() if callable(self._low_water) else self._low_water
        target = prefetch_target(self._held(), self._backlog(), low, self._max)
        # A message waiting for its countdown (a re-queued chunk) is unacked too: leave room for it.
        return target + _countdown_messages()

    def tick(self) -> int:
        target = self.target()
        qos = self._qos
        if qos is not None and target != qos.value:
            if self._hub is not None:
                self._hub.call_soon(self._apply, target)
            else:
                self._apply(target)
        return target

    def nudge(self) -> None:
        """Tick now (a chunk just ended); never raises."""
        try:
            self.tick()
        except Exception:
            log.exception("prefetch adjustment failed")

    def _apply(self, target: int) -> None:
        # Celery's consumer loop re-applies ``qos.value`` whenever it differs from the count last
        # set, so setting the count alone would be undone at once: move the value.
        qos = self._qos
        if qos is not None and target != qos.value:
            qos.value = target
            qos.update()

    def start(self) -> None:
        threading.Thread(target=self._run, name="dflash-prefetch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.nudge()


def _countdown_messages() -> int:
    """Messages this worker holds until their countdown expires (not yet running)."""
    from celery.worker import state

    try:
        return sum(1 for r in list(state.reserved_requests) if r.eta and r not in state.active_requests)
    except RuntimeError:  # the set changed while being copied: count it next tick
        return 0
