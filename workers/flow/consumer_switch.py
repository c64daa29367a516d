"""Stopping and restarting this worker's consumption of its queue, in-process.

A broadcast control command (``cancel_consumer`` over Redis pub/sub) can be lost in a Redis
blip and leave a worker that never consumes again; calling the consumer directly cannot.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class ConsumerSwitch:
    """Pause or resume consuming ``queue``; remembers the wish until the consumer is attached."""

    def __init__(self, queue: str) -> None:
        self._queue = queue
        self._consumer: Any = None
        self._on = True
        self._lock = threading.Lock()

    def attach(self, consumer: Any) -> None:
        """Called by the consumer bootstep before consuming starts."""
        with self._lock:
            self._consumer = consumer
            if not self._on:
                self._apply(False)

    def pause(self) -> None:
        self._set(False)

    def resume(self) -> None:
        self._set(True)

    def _set(self, on: bool) -> None:
        with self._lock:
            self._on = on
            if self._consumer is not None:
                self._apply(on)

    def _apply(self, on: bool) -> None:
        consumer = self._consumer
        if on:
            consumer.call_soon(consumer.add_task_queue, self._queue, None, "direct", None)
        else:
            consumer.call_soon(consumer.cancel_task_queue, self._queue)
        log.info("%s consuming queue %s", "resumed" if on else "stopped", self._queue)
