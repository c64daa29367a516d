"""Saying so when no live worker serves the job's model, instead of waiting in silence.

A job's chunks go to its model's queue (docs/routing.md); only workers whose server serves that
model take them. :class:`ServingWatch` reads the workers' heartbeats now and then and prints a
warning when none of the live ones serves the job's model, and a note when one does again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.errors import DflashError
from dflash_tasks.monitoring.fleet import check_serving

#: How often the heartbeats are read (s).
CHECK_SECONDS = 5.0


class ServingWatch:
    """Prints a warning whenever "no live worker serves model X" starts or changes, and its end."""

    def __init__(
        self,
        bookkeeping: Bookkeeping,
        model: str,
        every: float = CHECK_SECONDS,
        newline: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bk = bookkeeping
        self._model = model
        self._every = every
        self._newline = newline  # start on a new line (after a progress bar)
        self._stream = stream or sys.stderr
        self._clock = clock
        self._last = float("-inf")
        self._shown: str | None = None

    def poll(self) -> str | None:
        """Check if due; print what changed. Returns the current warning (None: the model is served)."""
        now = self._clock()
        if now - self._last < self._every:
            return self._shown
        self._last = now
        try:
            warning = check_serving(self._bk, self._model, time.time())
        except DflashError:  # Redis trouble is reported elsewhere; say nothing new
            return self._shown
        lead = "\n" if self._newline else ""
        if warning and warning != self._shown:
            print(
                f"{lead}warning: {warning}. The job's chunks wait in its model's queue until a worker "
                "whose server serves this model is started (docs/routing.md).",
                file=self._stream,
                flush=True,
            )
        elif not warning and self._shown:
            print(f"{lead}a live worker serves model {self._model!r} now", file=self._stream, flush=True)
        self._shown = warning
        return warning
