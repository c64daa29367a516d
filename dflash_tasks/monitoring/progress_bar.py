"""The producer's progress bar: tqdm's rendering, fed with the job's live rates.

The rates are the ones ``status`` and ``progress.json`` show (the workers' 5-second buckets over
the last minute, :func:`live_rates`), so the bar, the file and the table never disagree, and the
token rate moves from the first sample on, not from the first stored chunk. On a terminal the
line is redrawn in place; otherwise (a log file, CI) one line is printed every ``plain_every``
seconds and at the end.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.progress_keys import window_bounds
from dflash_tasks.monitoring.progress import window_rate


def live_rates(bookkeeping: Bookkeeping, job_id: str, now: float | None = None) -> tuple[float, float]:
    """(samples/s, tokens/s) of the job over the last minute, from the workers' rate buckets."""
    now = time.time() if now is None else now
    buckets = bookkeeping.rate_buckets(job_id, window_bounds(now))
    first = bookkeeping.job_info(job_id).get("started_at")
    since = float(first) if first else None
    return window_rate(buckets, "samples", now, since), window_rate(buckets, "tokens", now, since)


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


_FORMAT = "{percentage:5.1f}%|{bar}| {n_fmt}/{total_fmt}{unit} [{rate_fmt}{postfix}, ETA {remaining}]"


class ProgressBar:
    """Samples done out of ``total``, the sample and token rates, and the ETA at that rate."""

    def __init__(self, total: int, stream: TextIO | None = None, plain_every: float = 10.0) -> None:
        self.total = total
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._plain_every = plain_every
        self._last_plain = float("-inf")
        self._started = time.monotonic()
        self._drawn = False

    def render(self, done: int, samples_per_s: float, tokens_per_s: float, width: int = 100) -> str:
        line: str = tqdm.format_meter(
            done,
            self.total,
            time.monotonic() - self._started,
            ncols=width,
            unit=" samples",
            unit_scale=False,
            rate=samples_per_s if samples_per_s > 0 else None,
            postfix=f"{tokens_per_s:,.0f} tok/s",
            bar_format=_FORMAT,
        )
        return line

    def update(self, done: int, samples_per_s: float, tokens_per_s: float, force: bool = False) -> None:
        if self._tty:
            self._stream.write("\r" + self.render(done, samples_per_s, tokens_per_s))
            self._drawn = True
        else:
            now = time.monotonic()
            if not force and now - self._last_plain < self._plain_every:
                return
            self._last_plain = now
            self._stream.write(self.render(done, samples_per_s, tokens_per_s) + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False
