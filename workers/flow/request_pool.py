"""The worker's in-flight budget: at most ``target`` requests running, shared by every chunk it holds.

Requests are served first-in first-out, so the next chunk's requests fill the slots that a
draining chunk frees. The pool also counts requests waiting for a slot (the backlog), which
tells the worker when to take its next chunk.

The target can move while the worker runs (the in-flight tuner, ``--max-inflight auto``), between
1 and the pool's ``ceiling``: a request starts only while fewer than ``target`` run, so lowering
the target lets the running ones finish and starts no new one until the count is below it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class RequestPool:
    """A FIFO pool of request threads that knows how many of its tasks are waiting and running."""

    def __init__(self, max_inflight: int, ceiling: int | None = None) -> None:
        self.ceiling = max(ceiling or max_inflight, max_inflight)
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self._target = max_inflight
        self._executor = ThreadPoolExecutor(max_workers=self.ceiling, thread_name_prefix="dflash-req")
        self._lock = threading.Lock()
        self._pending: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._running = 0
        self._closed = False

    @property
    def max_inflight(self) -> int:
        """The in-flight target now: no request starts while this many run."""
        return self._target

    @property
    def waiting(self) -> int:
        """Requests submitted but not yet started (the backlog)."""
        return len(self._pending)

    @property
    def running(self) -> int:
        """Requests in flight."""
        return self._running

    def set_target(self, target: int) -> int:
        """Move the in-flight target (clamped to ``1..ceiling``); returns the value set."""
        target = max(1, min(self.ceiling, int(target)))
        with self._lock:
            self._target = target
            starts = self._take_startable_locked()
        self._start(starts)
        return target

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the request pool is shut down")
            self._pending.append((future, lambda: fn(*args, **kwargs)))
            starts = self._take_startable_locked()
        self._start(starts)
        return future

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending)
            self._pending.clear()
        for future, _ in pending:
            future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _take_startable_locked(self) -> list[tuple[Future[Any], Callable[[], Any]]]:
        """Pop the requests that may start now (FIFO; cancelled ones are dropped), counting them."""
        starts = []
        while self._pending and self._running < self._target and not self._closed:
            future, call = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            self._running += 1
            starts.append((future, call))
        return starts

    def _start(self, starts: list[tuple[Future[Any], Callable[[], Any]]]) -> None:
        for future, call in starts:
            try:
                self._executor.submit(self._run, future, call)
            except RuntimeError as exc:  # the executor is shut down
                self._finish()
                future.set_exception(exc)

    def _run(self, future: Future[Any], call: Callable[[], Any]) -> None:
        try:
            result = call()
        except BaseException as exc:
            self._finish()
            future.set_exception(exc)
        else:
            self._finish()
            future.set_result(result)

    def _finish(self) -> None:
        with self._lock:
            self._running -= 1
            starts = self._take_startable_locked()
        self._start(starts)
