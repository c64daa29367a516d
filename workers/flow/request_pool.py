"""The worker's in-flight budget: ``max_inflight`` threads shared by every chunk it holds.

Requests are served first-in first-out, so the next chunk's requests fill the slots that a
draining chunk frees. The pool also counts requests waiting for a slot (the backlog), which
tells the worker when to take its next chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class RequestPool:
    """A FIFO thread pool that knows how many of its tasks are waiting and running."""

    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self._executor = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="dflash-req")
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0

    @property
    def waiting(self) -> int:
        """Requests submitted but not yet started (the backlog)."""
        return self._waiting

    @property
    def running(self) -> int:
        """Requests in flight."""
        return self._running

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            self._waiting += 1
        started = threading.Event()

        def run() -> T:
            with self._lock:
                self._waiting -= 1
                self._running += 1
            started.set()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1

        future = self._executor.submit(run)

        def on_done(f: Future[T]) -> None:
            if f.cancelled() and not started.is_set():
                with self._lock:
                    self._waiting -= 1

        future.add_done_callback(on_done)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
