"""Writing ``progress.json``: one process per job and period, which also bills the GPU time."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.live_progress import LiveProgress
from dflash_tasks.coord.progress_keys import FLUSH_LAG, PROGRESS_KEY
from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.job import JobDefinition, Manifest
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.fleet import alive
from dflash_tasks.monitoring.progress import GPU_GAP_CAP, progress_document
from dflash_tasks.monitoring.settled import is_final, settle
from dflash_tasks.monitoring.snapshot import Snapshot, num, read_progress, read_snapshot
from dflash_tasks.store import Store

log = logging.getLogger(__name__)

#: Writers keep refreshing a done job's progress.json this long (s), so that the workers'
#: last counts land in it; then it is final and nobody writes it again.
FINAL_AFTER = 3 * FLUSH_LAG


class ProgressWriter:
    """Writes ``progress.json`` for a job at most about once per ``period`` across all processes.

    Every live process may call :meth:`write_if_due` every period: the one that takes the job's
    short Redis lock computes the document, bills the GPU time since the last tick, and writes it.
    """

    def __init__(
        self,
        bookkeeping: Bookkeeping,
        owner: str,
        period: float,
        queue: str = "",
        default_gpu_hour_usd: float = 0.0,
    ) -> None:
        self._bk = bookkeeping
        self._live = LiveProgress.of(bookkeeping)
        self._owner = owner
        self._period = period
        self._queue = queue
        self._price = default_gpu_hour_usd

    def write_if_due(
        self,
        job_id: str,
        store: Store,
        manifest: Manifest | None = None,
        definition: JobDefinition | None = None,
        now: float | None = None,
    ) -> dict[str, Any] | None:
        """Write the job's progress if no other process did within the period; the document or None."""
        if not self._bk.try_lock(f"progress:{job_id}", self._owner, max(self._period * 0.9, 0.2)):
            return None
        return self.write(job_id, store, manifest, definition, now)

    def write(
        self,
        job_id: str,
        store: Store,
        manifest: Manifest | None = None,
        definition: JobDefinition | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Compute, bill GPU time, and write ``progress.json`` now (the caller holds the lock)."""
        now = time.time() if now is None else now

        def snapshot() -> Snapshot:
            return read_snapshot(
                store,
                self._bk,
                job_id,
                now,
                queue=self._queue,
                manifest=manifest,
                definition=definition,
                default_gpu_hour_usd=self._price,
            )

        try:
            if not self._live.has_gpu_clock(job_id):  # a new job, or Redis lost its keys
                finished = self._finished_without_counters(job_id, store, snapshot(), now)
                if finished is not None:
                    return finished
                self._seed(job_id, store)
        except RetryableError as exc:
            log.debug("could not seed progress of job %s: %s", job_id, exc)
        snap = snapshot()
        if snap.redis_ok:
            try:
                snap = self._tick(snap, now)
            except RetryableError as exc:
                log.debug("could not bill GPU time of job %s: %s", job_id, exc)
        document = progress_document(snap, now, self._owner)
        doc = document.to_dict()
        store.write(PROGRESS_KEY, (json.dumps(doc, indent=1) + "\n").encode())
        header = document.header
        settled = now - (header.finished_at or now) >= FINAL_AFTER  # late worker counts have landed
        if header.state == JobState.DONE and snap.redis_ok and settled:
            try:
                self._live.mark_progress_final(job_id)
            except RetryableError as exc:
                log.debug("could not mark the progress of job %s final: %s", job_id, exc)
        return doc

    def _finished_without_counters(
        self, job_id: str, store: Store, snap: Snapshot, now: float
    ) -> dict[str, Any] | None:
        """A done job whose counters Redis lost: its final progress.json stays as it is (or one
        with recounted figures is written), and is marked final; never re-stamped as finished now."""
        previous = read_progress(store)
        settled = settle(store, snap, previous)
        if settled is None:
            return None
        doc = progress_document(settled, now, self._owner).to_dict()
        if not is_final(previous, snap):
            store.write(PROGRESS_KEY, (json.dumps(doc, indent=1) + "\n").encode())
        self._live.mark_progress_final(job_id)
        return doc

    def _seed(self, job_id: str, store: Store) -> None:
        """After a Redis loss, carry the start time, GPU time and price over from the last document."""
        previous = read_progress(store)
        if not previous or previous.get("job_id") != job_id:
            return
        cost = previous.get("cost") or {}
        if not isinstance(cost, dict):  # not a cost section: carry no GPU time or price over
            cost = None
        self._live.seed_gpu_clock(
            job_id,
            gpu_tick=previous.get("updated_at") or time.time(),
            started_at=previous.get("started_at"),
            gpu_seconds=None if cost is None else float(cost.get("gpu_hours") or 0.0) * 3600.0,
            gpu_hour_usd=None if cost is None else cost.get("gpu_hour_usd"),
        )

    def _tick(self, snap: Snapshot, now: float) -> Snapshot:
        """Bill ``live GPUs * time since the last tick`` and, once done, stamp ``finished_at``."""
        job = dict(snap.job)
        if job.get("finished_at"):
            return snap
        live = sum(1 for name in snap.per_worker if alive(snap.workers.get(name, {}), now))
        last = num(job.get("gpu_tick")) or num(job.get("started_at"))
        billed = live * min(max(0.0, now - last), GPU_GAP_CAP) if last else 0.0
        job = self._live.bill_gpu(snap.job_id, billed, now, finished=snap.done_chunks >= snap.total_chunks)
        return replace(snap, job=job)


def record_gpu_price(bookkeeping: Bookkeeping, job_id: str, gpu_hour_usd: float) -> None:
    """Record the job's price per GPU-hour, so every writer (and ``status``) prices it alike."""
    if gpu_hour_usd > 0:
        try:
            LiveProgress.of(bookkeeping).set_gpu_price(job_id, gpu_hour_usd)
        except RetryableError as exc:
            log.warning("could not record the GPU price of job %s: %s", job_id, exc)


def job_needs_progress(bookkeeping: Bookkeeping, job_id: str) -> bool:
    """False once a job's final (done) ``progress.json`` was written."""
    return not bookkeeping.job_info(job_id).get("progress_final")


def registered_jobs(bookkeeping: Bookkeeping) -> Iterable[str]:
    """Registered jobs still in progress (best effort: empty when Redis is unreachable)."""
    try:
        return [j for j in bookkeeping.jobs() if job_needs_progress(bookkeeping, j)]
    except DflashError as exc:
        log.debug("cannot list jobs: %s", exc)
        return []
