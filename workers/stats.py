"""A worker's live statistics and its share of writing ``progress.json``.

:class:`WorkerStats` counts the samples this worker finishes, in memory, and pushes the counts
to Redis every couple of seconds in one round trip (:class:`~dflash_tasks.coord.live_progress.LiveProgress`),
into 5-second rate buckets and per-worker totals, with a heartbeat of the worker's own state
(keys: :mod:`dflash_tasks.coord.keys`). Beside the token counts go the speculative-decoding
counts of the samples that report them (their completion tokens and verify passes), so that any
window's accept length is a ratio of sums. :class:`WorkerMonitor` runs that flush, polls the
server's lifetime accept length (the fallback when samples carry no per-request stats), serves
the Prometheus endpoint, and every ``progress_seconds`` offers to write the ``progress.json`` of
every registered job (one process per job wins each period).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache
from dflash_tasks.coord.live_progress import Field, LiveProgress
from dflash_tasks.coord.progress_keys import WINDOW_SECONDS, bucket_start
from dflash_tasks.coord.routing import server_queues
from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.settings import WorkerSettings
from dflash_tasks.core.spec_stats import SampleCounts
from dflash_tasks.core.spec_stats import accept_length as ratio
from dflash_tasks.monitoring import metrics
from dflash_tasks.monitoring.metrics import PrometheusListener
from dflash_tasks.monitoring.progress_writer import ProgressWriter, registered_jobs
from workers.flow.tuner_loop import TunerLoop
from workers.sglang_client import SGLangClient

if TYPE_CHECKING:
    from workers.chunk_runner import ChunkContext


log = logging.getLogger(__name__)

#: How often a worker pushes its counts and heartbeat (s), at most.
FLUSH_SECONDS = 2.0
#: How often a worker asks its server for the accept length (s).
ACCEPT_POLL_SECONDS = 15.0


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
            return ratio(sum(t for _, t, _ in self._recent), sum(v for _, _, v in self._recent))

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
    """:class:`WorkerStats` as a worker listener (``workers.listener``): the live-progress counters."""

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

    def delivery(self, result: Mapping[str, Any], redelivered: bool) -> None:
        pass

    def chunk_requeued(self, reason: str) -> None:
        pass


class WorkerMonitor:
    """The worker's monitoring threads: stats flush + heartbeat, accept length, progress.json."""

    def __init__(
        self,
        settings: WorkerSettings,
        bookkeeping: Bookkeeping,
        jobs: JobCache,
        client: SGLangClient,
        hostname: str,
        state: Callable[[], dict[str, Any]],
        stats: WorkerStats,
        prometheus: PrometheusListener,
    ) -> None:
        self.settings = settings
        self.hostname = hostname
        self._bk = bookkeeping
        self._jobs = jobs
        self._client = client
        self._state = state
        self._beat = min(FLUSH_SECONDS, settings.progress_seconds)
        self.stats = stats
        self.prometheus = prometheus
        prometheus.recent_accept = stats.recent_accept_length
        self.writer = ProgressWriter(
            bookkeeping,
            owner=hostname,
            period=settings.progress_seconds,
            queue=settings.queue,
            default_gpu_hour_usd=settings.gpu_hour_usd,
        )
        self.accept: float | None = None  # the server's lifetime figure (internal_states)
        self._stop = threading.Event()

    @classmethod
    def for_worker(
        cls,
        settings: WorkerSettings,
        ctx: ChunkContext,
        hostname: str,
        held: Callable[[], int],
        healthy: Callable[[], bool],
        stats: WorkerStats,
        prometheus: PrometheusListener,
        tuner: TunerLoop | None = None,
    ) -> WorkerMonitor:
        """Wire a monitor to a worker's pool, chunk count, health and in-flight tuner."""

        def queues() -> list[str]:
            served = ctx.server.current
            if served is None:
                return [settings.queue]
            return server_queues(settings.queue, served.served_model_name, served.model_path)

        def state() -> dict[str, Any]:
            served = ctx.server.current
            return {
                "endpoint": ctx.identity.endpoint,
                "model": served.served_model_name if served else "",
                "model_path": served.model_path if served else "",
                "sglang_version": served.version if served else "",
                "queues": ",".join(queues()),
                "inflight": ctx.pool.running,
                "waiting": ctx.pool.waiting,
                "max_inflight": ctx.pool.max_inflight,
                "held_chunks": held(),
                "healthy": healthy(),
                "server_accept_length": monitor.accept,
                # the tuner's target, phase, reason and measured curve, as one JSON field
                "tuner": json.dumps(tuner.state(), separators=(",", ":")) if tuner else "",
            }

        monitor = cls(settings, ctx.bookkeeping, ctx.jobs, ctx.client, hostname, state, stats, prometheus)
        prometheus.watch_worker(
            lambda: ctx.pool.running,
            lambda: ctx.pool.waiting,
            held,
            healthy,
            lambda: ctx.pool.max_inflight,
        )
        if tuner is not None:
            prometheus.watch_tuner(tuner.state)
        prometheus.watch_queue(LiveProgress.of(ctx.bookkeeping), queues)
        return monitor

    def start(self) -> None:
        metrics.start_server(self.settings.metrics_port, self.settings.metrics_address)
        for target, name in (
            (self._flush_loop, "dflash-stats"),
            (self._progress_loop, "dflash-progress"),
            (self._accept_loop, "dflash-accept"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.stats.wake.set()

    def flush_now(self) -> None:
        self.stats.flush(self._state())

    def poll_accept_length(self) -> float | None:
        """The server's lifetime accept length (None while it reports none, or cannot answer)."""
        try:
            value = self._client.server_info(timeout=5.0).lifetime_accept_length
        except DflashError as exc:
            log.debug("no accept length from the server: %s", exc)
            return None
        if value is not None:
            self.accept = value
            self.prometheus.server_accept = value
        return value

    def write_progress(self) -> int:
        """Offer to write the progress of every registered job; returns how many this process wrote."""
        written = 0
        for job_id in registered_jobs(self._bk):
            try:
                handle = self._jobs.get(job_id)
                doc = self.writer.write_if_due(job_id, handle.store, handle.manifest, handle.definition)
                if doc is not None:
                    self.prometheus.progress_written(doc)
                    written += 1
            except DflashError as exc:  # an unknown or unreachable job: another process may write it
                log.debug("no progress for job %s: %s", job_id, exc)
        return written

    def _flush_loop(self) -> None:
        failing = False
        first = True
        while not self._stop.is_set():
            if not first:  # the first heartbeat goes out at once: enqueue looks for this worker
                self.stats.wake.wait(self._beat)
            first = False
            self.stats.wake.clear()
            try:
                self.flush_now()
                failing = False
            except RetryableError as exc:
                if not failing:
                    log.warning("could not push live stats (will retry): %s", exc)
                failing = True
            except Exception:
                log.exception("live stats flush crashed")

    def _progress_loop(self) -> None:
        while not self._stop.wait(self.settings.progress_seconds):
            try:
                self.write_progress()
            except Exception:
                log.exception("progress writer crashed")

    def _accept_loop(self) -> None:
        while True:
            try:
                self.poll_accept_length()
            except Exception:
                log.debug("accept length poll failed", exc_info=True)
            if self._stop.wait(ACCEPT_POLL_SECONDS):
                return
