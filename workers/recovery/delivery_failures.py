"""What a delivery that failed becomes: re-routed, re-queued, dropped, or parked.

Never dropped by accident: another model's chunk goes to its model's queue; a dead server's chunk
is re-queued at once (and the health gate told); a chunk of no known job is dropped; any other
failure (store or Redis trouble, or a bug) re-queues the chunk with a growing delay, and a chunk
failing with a permanent error :data:`MAX_CHUNK_FAILURES` times is parked instead: not queued
again until ``resume`` (or a re-run of enqueue), and shown by ``status``.
"""

from __future__ import annotations

import logging

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import UnknownJob
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.errors import (
    DflashError,
    PermanentError,
    RetryableError,
    ServerUnavailable,
    WrongModel,
)
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.states import Cause, Delivery
from workers.flow.health import HealthGate
from workers.recovery.requeue import Requeuer

log = logging.getLogger(__name__)

#: A chunk failing this many times with a permanent error is parked until ``resume``.
MAX_CHUNK_FAILURES = 5
#: The longest delay before a failed chunk is delivered again (s).
MAX_REQUEUE_DELAY_SECONDS = 600.0


def requeue_delay(first: float, failures: int) -> float:
    """The delay before the next delivery of a chunk that failed ``failures`` times: ``first``,
    doubled with each failure, at most :data:`MAX_REQUEUE_DELAY_SECONDS`."""
    return float(min(MAX_REQUEUE_DELAY_SECONDS, first * 2 ** (failures - 1)))


class DeliveryFailures:
    """Turns the exception a delivery raised into what became of it (see the module docstring)."""

    def __init__(
        self, bookkeeping: Bookkeeping, requeuer: Requeuer, health: HealthGate, requeue_backoff: float
    ) -> None:
        self.bookkeeping = bookkeeping
        self.requeuer = requeuer
        self.health = health
        self.requeue_backoff = requeue_backoff  # the first delay (s): DFLASH_REQUEUE_BACKOFF

    def outcome_of(
        self, exc: Exception, job_id: str, chunk: int, queue: str = "", repair: RepairUnit | None = None
    ) -> DeliveryOutcome:
        """Re-route, re-queue, drop or park the chunk (or its ``repair`` round) taken from ``queue``."""
        if isinstance(exc, WrongModel):  # never generate another model's chunk: to its model's queue
            target = self.requeuer.requeue(job_id, chunk, fallback=queue, repair=repair)
            log.warning(
                "chunk %d of job %s (from queue %s) put on queue %s: %s", chunk, job_id, queue, target, exc
            )
            return DeliveryOutcome(Delivery.REROUTED, str(exc), Cause.WRONG_MODEL)
        if isinstance(exc, ServerUnavailable):
            self.requeuer.requeue(job_id, chunk, fallback=queue, repair=repair)  # first: not after the pause
            self.health.mark_down(str(exc))
            log.warning("chunk %d of job %s re-queued: %s", chunk, job_id, exc)
            return DeliveryOutcome(Delivery.REQUEUED, str(exc), Cause.SERVER_UNHEALTHY)
        if isinstance(exc, UnknownJob):
            log.error("dropping chunk %d: %s", chunk, exc)
            return DeliveryOutcome(Delivery.DROPPED, str(exc), Cause.BAD_MESSAGE)
        return self._park_or_requeue(exc, job_id, chunk, queue, repair)

    def _park_or_requeue(
        self, exc: Exception, job_id: str, chunk: int, queue: str, repair: RepairUnit | None
    ) -> DeliveryOutcome:
        """Store or Redis trouble, or a bug: never drop the chunk; park it after repeated permanent
        failures, else re-queue it with a growing delay."""
        try:
            failures = self.bookkeeping.count_chunk_failure(job_id, chunk)
        except DflashError:
            failures = 1
        reason = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermanentError) and failures >= MAX_CHUNK_FAILURES:
            try:
                self.bookkeeping.park_chunk(job_id, chunk, reason)
                log.error("chunk %d of job %s parked after %d failures: %s", chunk, job_id, failures, reason)
                return DeliveryOutcome(Delivery.PARKED, reason, Cause.ERROR)
            except DflashError:
                pass  # cannot park without Redis: keep retrying
        delay = requeue_delay(self.requeue_backoff, failures)
        self.requeuer.requeue(job_id, chunk, countdown=delay, fallback=queue, repair=repair)
        log.log(
            logging.WARNING if isinstance(exc, RetryableError) else logging.ERROR,
            "chunk %d of job %s re-queued in %.0fs: %s",
            chunk,
            job_id,
            delay,
            reason,
            exc_info=not isinstance(exc, DflashError),
        )
        return DeliveryOutcome(Delivery.REQUEUED, reason, Cause.ERROR)
