"""A terminal progress bar with windowed rates and an ETA."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TextIO


class RateWindow:
    """Rates of monotone counters over the last ``seconds``."""

    def __init__(self, seconds: float = 60.0) -> None:
        self._seconds = seconds
        self._points: deque[tuple[float, float, float]] = deque()

    def add(self, samples: float, tokens: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._points.append((now, samples, tokens))
        while len(self._points) > 2 and now - self._points[1][0] >= self._seconds:
            self._points.popleft()

    def rates(self) -> tuple[float, float]:
        """(samples/s, tokens/s) over the window; zeros until two points exist."""
        if len(self._points) < 2:
            return 0.0, 0.0
        (t0, s0, k0), (t1, s1, k1) = self._points[0], self._points[-1]
        dt = t1 - t0
        return ((s1 - s0) / dt, (k1 - k0) / dt) if dt > 0 else (0.0, 0.0)


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressBar:
    """Redraws one line on a terminal; prints a line every ``plain_every`` seconds otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30, plain_every: float = 10.0):
        self.total = total
        self._stream = stream or sys.stderr
        self._width = width
        self._tty = self._stream.isatty()
        self._plain_every = plain_every
        self._last_plain = float("-inf")

    def render(self, done: int, samples_per_s: float, tokens_per_s: float) -> str:
        frac = done / self.total if self.total else 1.0
        filled = int(frac * self._width)
        eta = (self.total - done) / samples_per_s if samples_per_s > 0 else None
        bar = "#" * filled + "-" * (self._width - filled)
        return (
            f"[{bar}] {done:,}/{self.total:,} samples {frac:6.1%} | "
            f"{tokens_per_s:,.0f} tok/s {samples_per_s:,.2f} samples/s | ETA {format_duration(eta)}"
        )

    def update(self, done: int, samples_per_s: float, tokens_per_s: float, force: bool = False) -> None:
        line = self.render(done, samples_per_s, tokens_per_s)
        if self._tty:
            self._stream.write("\r" + line)
        else:
            now = time.monotonic()
            if not force and now - self._last_plain < self._plain_every:
                return
            self._last_plain = now
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
