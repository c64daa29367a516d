"""Which queues this worker consumes, and stopping and restarting consumption, in-process.

A broadcast control command (``cancel_consumer`` over Redis pub/sub) can be lost in a Redis
blip and leave a worker that never consumes again; calling the consumer directly cannot.
The queues change when the server's model changes (its model queues, docs/routing.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


class ConsumerSwitch:
    """Consume ``queues`` while on, nothing while paused; remembers the wish until the consumer is
    attached. The consumer starts consuming :attr:`queues` as they are when it is started."""

    def __init__(self, queues: Sequence[str]) -> None:
        self._wanted = list(queues)
        self._active = list(queues)  # what the consumer consumes (it starts with the wanted queues)
        self._consumer: Any = None
        self._on = True
        self._lock = threading.Lock()

    @property
    def queues(self) -> list[str]:
        """The queues consumed while on."""
        return list(self._wanted)

    def starting(self) -> list[str]:
        """The queues the consumer starts with (``--queues``); call just before starting it."""
        with self._lock:
            self._active = list(self._wanted)
            return list(self._wanted)

    def attach(self, consumer: Any) -> None:
        """Called by the consumer bootstep before consuming starts."""
        with self._lock:
            self._consumer = consumer
            self._apply()

    def pause(self) -> None:
        self._set(on=False)

    def resume(self) -> None:
        self._set(on=True)

    def set_queues(self, queues: Sequence[str]) -> None:
        """Consume ``queues`` from now on (when on)."""
        with self._lock:
            self._wanted = list(queues)
            if self._consumer is not None:
                self._apply()

    def _set(self, on: bool) -> None:
        with self._lock:
            self._on = on
            if self._consumer is not None:
                self._apply()

    def _apply(self) -> None:
        consumer = self._consumer
        target = self._wanted if self._on else []
        for queue in target:
            if queue not in self._active:
                consumer.call_soon(consumer.add_task_queue, queue, None, "direct", None)
                log.info("consuming queue %s", queue)
        for queue in self._active:
            if queue not in target:
                consumer.call_soon(consumer.cancel_task_queue, queue)
                log.info("stopped consuming queue %s", queue)
        self._active = list(target)
