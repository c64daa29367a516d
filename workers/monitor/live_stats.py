"""The worker's live statistics: what it finished since the last flush, and the flush itself.

:class:`WorkerStats` counts the samples this worker finishes, in memory, and pushes the counts
to Redis every couple of seconds in one round trip (:class:`~dflash_tasks.coord.live_progress.LiveProgress`),
into 5-second rate buckets and per-worker totals, with a heartbeat of the worker's own state
(keys: :mod:`dflash_tasks.coord.keys`). Beside the token counts go the speculative-decoding
counts of the samples that report them (their completion tokens and verify passes), so that any
window's accept length is a ratio of sums. :class:`StatsListener` feeds it the worker's events.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.live_progress import Field, LiveProgress
from dflash_tasks.coord.progress_keys import WINDOW_SECONDS, bucket_start
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.spec_stats import SampleCounts, pooled_accept_length

#: How often a worker pushes its counts and heartbeat (s), at most.
FLUSH_SECONDS = 2.0


class WorkerStats:
    """This worker's sample counts since the last flush, and the flush itself."""

    def __init__(self, bookkeeping: Bookkeeping, worker: str, beat: float = FLUSH_SECONDS) -> None:
        self._live = LiveProgress.of(bookkeeping)
        self._worker = worker
        self._beat = beat
        self._lock = threading.Lock()
        self._buckets: defaultdict[tuple[str, int], Counter[str]] = defaultdict(Counter)
        self._totals: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._first: dict[str, float] = {}
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, spec tokens, verify passes)
        #: Set when a chunk is stored: the flush loop pushes the counts at once.
        self.wake = threading.Event()

    # StatsListener calls these as the worker reports its events.
    def sample_done(
        self,
        job_id: str,
        ok: bool,
        tokens: int,
        spec_tokens: int = 0,
        verify: int = 0,
        now: float | None = None,
        *,
        turns: int = 1,
    ) -> None:
        """Count a finished sample; ``spec_tokens``/``verify``: its tokens and verify passes when it
        reported speculative stats (see :func:`dflash_tasks.core.spec_stats.spec_counts`);
        ``turns``: how many turns (generations) it settles."""
        now = time.time() if now is None else now
        w = self._worker
        failed = 0 if ok else 1
        with self._lock:
            bucket = self._buckets[(job_id, bucket_start(now))]
            totals = self._totals[job_id]
            for counts in (bucket, totals):
                counts["samples"] += 1
                counts["failed"] += failed
                counts["tokens"] += tokens
            bucket["turns"] += turns
            bucket[f"{w}|samples"] += 1
            bucket[f"{w}|tokens"] += tokens
            if verify > 0:
                for counts in (bucket, totals):
                    counts["spec_tokens"] += spec_tokens
                    counts["verify"] += verify
                bucket[f"{w}|spec_tokens"] += spec_tokens
                bucket[f"{w}|verify"] += verify
                self._recent.append((now, spec_tokens, verify))
                self._forget_before(now - WINDOW_SECONDS)

    def _forget_before(self, cutoff: float) -> None:
        """Drop the per-sample accept-length entries older than ``cutoff`` (the lock is held): they
        would otherwise pile up for the whole run when nothing scrapes the last-minute figure."""
        recent = self._recent
        while recent and recent[0][0] < cutoff:
            recent.popleft()

    def recent_accept_length(self, now: float | None = None, window: float = WINDOW_SECONDS) -> float | None:
        """Σ tokens / Σ verify passes of this worker's samples of the last ``window`` seconds."""
        now = time.time() if now is None else now
        with self._lock:
            self._forget_before(now - window)
            return pooled_accept_length(
                sum(t for _, t, _ in self._recent), sum(v for _, _, v in self._recent)
            )

    def chunk_started(self, job_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self._first[job_id] = min(self._first.get(job_id, now), now)

    def chunk_done(self, job_id: str) -> None:
        with self._lock:
            self._totals[job_id]["chunks"] += 1
        self.wake.set()

    def flush(self, state: Mapping[str, Any], now: float | None = None) -> None:
        """Push the counts gathered since the last flush and this worker's heartbeat, in one round trip.

        On a Redis error the counts are kept for the next flush and :class:`RetryableError` is raised.
        """
        now = time.time() if now is None else now
        with self._lock:
            buckets, self._buckets = self._buckets, defaultdict(Counter)
            totals, self._totals = self._totals, defaultdict(Counter)
            first, self._first = self._first, {}
        beat: dict[str, Field] = {"last_seen": now, "beat_s": self._beat, "pid": os.getpid()}
        beat.update({name: _field(v) for name, v in state.items()})
        try:
            self._live.push(self._worker, buckets, totals, first, beat)
        except RetryableError:
            with self._lock:
                for key2, counts in buckets.items():
                    self._buckets[key2].update(counts)
                for job_id, counts in totals.items():
                    self._totals[job_id].update(counts)
                for job_id, t in first.items():
                    self._first[job_id] = min(self._first.get(job_id, t), t)
            raise


def _field(value: Any) -> Field:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return ""
    return value if isinstance(value, int | float) else str(value)


class StatsListener:
    """:class:`WorkerStats` as a worker listener (:mod:`workers.monitor.listener`): the live counters."""

    def __init__(self, stats: WorkerStats) -> None:
        self.stats = stats

    def request_failed(self, exc: BaseException, will_retry: bool) -> None:
        pass

    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        self.stats.sample_done(
            job_id, counts.ok, counts.completion_tokens, counts.spec_tokens, counts.verify, turns=counts.turns
        )

    def chunk_started(self, job_id: str) -> None:
        self.stats.chunk_started(job_id)

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        self.stats.chunk_done(job_id)

    def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
        pass

    def chunk_requeued(self, reason: str) -> None:
        pass
