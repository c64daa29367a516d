"""The worker's monitoring threads and its share of writing ``progress.json``.

:class:`WorkerMonitor` runs the flush of the live statistics (:mod:`workers.monitor.live_stats`)
with the worker's heartbeat, polls the server's lifetime accept length (the fallback when samples
carry no per-request stats), serves the Prometheus endpoint, and every ``progress_seconds`` offers
to write the ``progress.json`` of every registered job (one process per job wins each period).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache
from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.settings import WorkerSettings
from dflash_tasks.monitoring import metrics
from dflash_tasks.monitoring.metrics import PrometheusListener
from dflash_tasks.monitoring.progress_writer import ProgressWriter, registered_jobs
from workers.monitor.live_stats import FLUSH_SECONDS, WorkerStats
from workers.sglang_client import SGLangClient

log = logging.getLogger(__name__)

#: How often a worker asks its server for the accept length (s).
ACCEPT_POLL_SECONDS = 15.0


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
