"""Lease heartbeats and the reconciler that re-queues chunks whose worker died.

A worker renews the leases of the chunks it runs every ``heartbeat_seconds``. When a worker
(or its whole machine) dies, its leases stop being renewed; within ``lease_seconds`` +
``reconcile_seconds`` some live worker notices the expired lease and queues the chunk again,
without waiting for the broker's visibility timeout (hours, by design).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.publish import parse_task_id
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.job import output_key
from dflash_tasks.store import Store
from workers.monitor.listener import NO_LISTENER, WorkerListener
from workers.recovery import events

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Tracks this process's leases and renews them from one background thread."""

    def __init__(self, bookkeeping: Bookkeeping, lease_seconds: float, heartbeat_seconds: float) -> None:
        self._bk = bookkeeping
        self._lease = lease_seconds
        self._beat = heartbeat_seconds
        self._held: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, job_id: str, chunk: int, owner: str) -> None:
        with self._lock:
            self._held[(job_id, chunk)] = owner

    def drop(self, job_id: str, chunk: int) -> None:
        """Stop renewing a lease: call it before the lease is given back (released or completed).
        It waits for a renewal in flight, so none can re-create the lease after it is gone."""
        with self._lock:
            self._held.pop((job_id, chunk), None)

    def held(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return [(job, chunk, owner) for (job, chunk), owner in self._held.items()]

    def renew_now(self) -> None:
        with self._lock:  # a lease dropped meanwhile is not renewed (renewal re-creates lost ones)
            held = [(job, chunk, owner) for (job, chunk), owner in self._held.items()]
            if held:
                self._bk.renew(held, self._lease)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dflash-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._beat):
            try:
                self.renew_now()
            except DflashError as exc:
                log.warning("lease heartbeat failed: %s", exc)
            except Exception:  # the heartbeat must outlive any bug: a dead one doubles the work
                log.exception("lease heartbeat crashed; continuing")


class Reconciler:
    """Re-queues chunks whose lease expired; at most one live worker runs a pass at a time."""

    def __init__(
        self,
        bookkeeping: Bookkeeping,
        open_job_store: Callable[[str], Store],
        requeue: Callable[[str, int], object],
        owner: str,
        interval: float,
        lease_seconds: float = 60.0,
        visibility_timeout: float = 12 * 3600,
        replan: Callable[[str], list[int]] | None = None,
        replan_seconds: float = 300.0,
        listener: WorkerListener = NO_LISTENER,
    ) -> None:
        self._bk = bookkeeping
        self._replan = replan
        self._replan_seconds = replan_seconds
        self._listener = listener
        self._last_replan = time.monotonic()
        self._open = open_job_store
        self._requeue = requeue
        self._owner = owner
        self._interval = interval
        self._lease_seconds = lease_seconds
        self._visibility_timeout = visibility_timeout
        self._stop = threading.Event()

    def run_once(self) -> list[tuple[str, int]]:
        """One pass over every registered job; returns the (job, chunk) pairs re-queued."""
        if not self._bk.try_lock("reconcile", self._owner, max(self._interval * 0.8, 1.0)):
            return []
        requeued: list[tuple[str, int]] = []
        jobs = self._bk.jobs()
        for job_id in jobs:
            try:
                requeued += self._reconcile_job(job_id)
            except DflashError as exc:  # one broken job must not stop the others' recovery
                log.warning("reconciling job %s failed: %s", job_id, exc)
        requeued += self._rescue_unleased(set(jobs), set(requeued))
        if self._replan is not None and time.monotonic() - self._last_replan >= self._replan_seconds:
            self._last_replan = time.monotonic()
            requeued += self._replan_all(jobs)
        return requeued

    def _replan_all(self, jobs: list[str]) -> list[tuple[str, int]]:
        """The backstop: queue every chunk that is neither done, running, queued nor held.

        Catches what no lease or delivery record shows, e.g. a message a worker popped from the
        queue and died before the broker recorded it as delivered; without it only a re-run of
        enqueue (or ``enqueue --wait``) would find such a chunk.
        """
        assert self._replan is not None
        requeued: list[tuple[str, int]] = []
        for job_id in jobs:
            try:
                chunks = self._replan(job_id)
            except DflashError as exc:
                log.warning("re-planning job %s failed: %s", job_id, exc)
                continue
            for chunk in chunks:
                events.emit(log, self._listener, "replan", job_id, chunk, "neither done, running nor queued")
            requeued += [(job_id, chunk) for chunk in chunks]
        return requeued

    def _rescue_unleased(self, jobs: set[str], requeued: set[tuple[str, int]]) -> list[tuple[str, int]]:
        """Re-queue chunks delivered to a worker that died before it could lease them.

        Such a message sits in the broker's unacked set until the visibility timeout (hours);
        the original is skipped cheaply when it finally comes back. A chunk with a lease record,
        live or expired, is left to the lease path (so each chunk has one way back), and a dead
        worker's delivery of a chunk the lease path has just re-queued (``requeued``) is marked
        handled, not queued twice.
        """
        rescued: list[tuple[str, int]] = []
        now = time.time()
        for delivery in self._bk.unacked_deliveries():
            parsed = parse_task_id(delivery.task_id)
            if parsed is None or parsed[0] not in jobs or not delivery.stale(now, self._lease_seconds):
                continue
            job_id, chunk = parsed
            try:
                if (job_id, chunk) in requeued:  # and never rescue this delivery later either
                    self._bk.try_lock(f"rescued:{delivery.tag}", self._owner, self._visibility_timeout)
                    continue
                # A chunk with a lease, live or expired, is the lease path's: the two never overlap.
                if chunk in self._bk.owners(job_id) or self._open(job_id).exists(output_key(chunk)):
                    continue
                if not self._bk.try_lock(f"rescued:{delivery.tag}", self._owner, self._visibility_timeout):
                    continue
                self._requeue(job_id, chunk)
            except DflashError as exc:  # one broken job must not stop the others' recovery
                log.warning("rescuing chunk %d of job %s failed: %s", chunk, job_id, exc)
                continue
            rescued.append((job_id, chunk))
            events.emit(
                log,
                self._listener,
                "unleased_delivery",
                job_id,
                chunk,
                "delivered to a worker that died before starting it",
            )
        return rescued

    def _reconcile_job(self, job_id: str) -> list[tuple[str, int]]:
        expired = self._bk.expired_leases(job_id)
        if not expired:
            return []
        store = self._open(job_id)
        requeued: list[tuple[str, int]] = []
        for chunk in expired:
            if self._bk.claim_expired(job_id, chunk) and not store.exists(output_key(chunk)):
                self._requeue(job_id, chunk)
                requeued.append((job_id, chunk))
                events.emit(
                    log, self._listener, "lease_expired", job_id, chunk, "its lease expired (worker lost)"
                )
        return requeued

    def start(self) -> None:
        threading.Thread(target=self._run, name="dflash-reconciler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.run_once()
            except DflashError as exc:
                log.warning("reconciler pass failed: %s", exc)
            except Exception:
                log.exception("reconciler pass crashed")
