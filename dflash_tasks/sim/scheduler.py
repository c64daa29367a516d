"""Running slots with a FIFO wait queue, and time-weighted occupancy statistics."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class QueueFull(Exception):
    """The wait queue already holds ``max_queued_requests`` requests."""


class Stopped(Exception):
    """The simulator is shutting down."""


class Gone(Exception):
    """The client went away while its request waited for a slot."""


class SlotScheduler:
    """At most ``max_running`` requests hold a slot; the rest wait in arrival order.

    Occupancy is the time integral of the running count: ``mean_running`` covers the busy window
    from the first slot taken (since the last reset) to the last slot released (or now, while
    requests are running); ``mean_running_since_start`` covers the whole time since the last reset.
    """

    def __init__(
        self, max_running: int, max_queued: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self._clock = clock
        self._cond = threading.Condition()
        self._running = 0
        self._waiting: deque[object] = deque()
        self._stopped = False
        self._reset_at = 0.0
        self._last_change = 0.0
        self._area = 0.0
        self._area_at_release = 0.0
        self._first_start: float | None = None
        self._last_release: float | None = None
        self._peak = 0
        self._peak_waiting = 0
        self._rejected = 0
        self._reset_locked(clock())

    @contextmanager
    def slot(self, gone: Callable[[], bool] | None = None, poll: float = 4.0) -> Iterator[None]:
        """Hold a running slot for the duration of the ``with`` block (see :meth:`acquire`)."""
        self.acquire(gone, poll)
        try:
            yield
        finally:
            self.release()

    def acquire(self, gone: Callable[[], bool] | None = None, poll: float = 4.0) -> None:
        """Take a slot, waiting in FIFO order; raises :class:`QueueFull` or :class:`Stopped`, and
        :class:`Gone` when ``gone()`` says so at one of the checks made every ``poll`` seconds
        while waiting (SGLang looks at a waiting request's connection every 4 s)."""
        with self._cond:
            if self._stopped:
                raise Stopped
            if self._running < self.max_running and not self._waiting:
                self._start_locked()
                return
            if self.max_queued is not None and len(self._waiting) >= self.max_queued:
                self._rejected += 1
                raise QueueFull
            self._wait_turn_locked(object(), gone, poll)

    def release(self) -> None:
        """Give a slot back and wake the head of the queue."""
        with self._cond:
            now = self._advance_locked()
            self._running -= 1
            self._last_release = now
            self._area_at_release = self._area
            self._cond.notify_all()

    def stop(self) -> None:
        """Make every waiting and future :meth:`acquire` raise :class:`Stopped`."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """``(running, waiting)`` right now."""
        with self._cond:
            return self._running, len(self._waiting)

    def reset_stats(self) -> None:
        """Restart the occupancy window and counters (the live counts stay)."""
        with self._cond:
            self._reset_locked(self._clock())

    def snapshot(self) -> dict[str, Any]:
        """Live counts plus occupancy statistics, JSON-ready."""
        with self._cond:
            now = self._clock()
            area_now = self._area + self._running * (now - self._last_change)
            window_s, window_area = self._window_locked(now, area_now)
            since_s = now - self._reset_at
            mean = window_area / window_s if window_s > 0 else 0.0
            mean_since = area_now / since_s if since_s > 0 else 0.0
            return {
                "running": self._running,
                "waiting": len(self._waiting),
                "max_running": self.max_running,
                "max_queued": self.max_queued,
                "peak_running": self._peak,
                "peak_waiting": self._peak_waiting,
                "rejected": self._rejected,
                "mean_running": mean,
                "occupancy": mean / self.max_running,
                "window_seconds": window_s,
                "mean_running_since_start": mean_since,
                "occupancy_since_start": mean_since / self.max_running,
                "seconds_since_start": since_s,
            }

    def _wait_turn_locked(self, ticket: object, gone: Callable[[], bool] | None, poll: float) -> None:
        self._waiting.append(ticket)
        self._peak_waiting = max(self._peak_waiting, len(self._waiting))
        check_at = self._clock() + poll
        try:
            while not (self._waiting[0] is ticket and self._running < self.max_running):
                if self._stopped:
                    raise Stopped
                if gone is None:
                    self._cond.wait()
                    continue
                if self._clock() >= check_at:
                    if gone():
                        raise Gone
                    check_at = self._clock() + poll
                self._cond.wait(max(0.0, check_at - self._clock()))
        except BaseException:
            self._waiting.remove(ticket)
            self._cond.notify_all()
            raise
        self._waiting.popleft()
        self._start_locked()
        self._cond.notify_all()

    def _start_locked(self) -> None:
        now = self._advance_locked()
        if self._first_start is None:
            self._first_start = now
        self._running += 1
        self._peak = max(self._peak, self._running)

    def _advance_locked(self) -> float:
        now = self._clock()
        self._area += self._running * (now - self._last_change)
        self._last_change = now
        return now

    def _window_locked(self, now: float, area_now: float) -> tuple[float, float]:
        if self._first_start is None:
            return 0.0, 0.0
        if self._running > 0:
            return now - self._first_start, area_now
        if self._last_release is None:
            return 0.0, 0.0
        return self._last_release - self._first_start, self._area_at_release

    def _reset_locked(self, now: float) -> None:
        self._reset_at = now
        self._last_change = now
        self._area = 0.0
        self._area_at_release = 0.0
        self._first_start = now if self._running else None
        self._last_release = None
        self._peak = self._running
        self._peak_waiting = len(self._waiting)
        self._rejected = 0
