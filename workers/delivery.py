"""Handling one delivered message: run the chunk or its repair round, and never raise for an
expected failure (what a failure becomes is :mod:`workers.recovery.delivery_failures`)."""

from __future__ import annotations

import logging
import threading
import uuid

from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.states import Cause, Delivery
from workers.chunk_runner import ChunkWork
from workers.flow.health import HealthGate
from workers.flow.prefetch import PrefetchController
from workers.leased_work import ChunkContext, LeasedWork, run_leased
from workers.recovery.delivery_failures import DeliveryFailures
from workers.repair_runner import RepairWork

log = logging.getLogger(__name__)


class HeldChunks:
    """How many chunks this worker is running now (its prefetch follows it)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        with self._lock:
            self._n += delta

    def count(self) -> int:
        return self._n


class DeliveryHandler:
    """Runs each delivered chunk message, or a chunk's repair round, on this worker."""

    def __init__(
        self,
        ctx: ChunkContext,
        hostname: str,
        health: HealthGate,
        prefetch: PrefetchController,
        held: HeldChunks,
        failures: DeliveryFailures,
    ) -> None:
        self.ctx = ctx
        self.hostname = hostname
        self.health = health
        self.prefetch = prefetch
        self.held = held
        self.failures = failures

    def handle(
        self, job_id: str, chunk: int, task_id: str, queue: str = "", repair: RepairUnit | None = None
    ) -> DeliveryOutcome:
        """Run chunk ``chunk`` of ``job_id``, or its ``repair`` round (taken from ``queue``)."""
        if not self.health.healthy:  # not consuming any more; don't bounce it straight back here
            countdown = self.health.poll_seconds
            self.failures.requeuer.requeue(job_id, chunk, countdown=countdown, fallback=queue, repair=repair)
            return DeliveryOutcome(Delivery.REQUEUED, "server unhealthy", Cause.SERVER_UNHEALTHY)
        owner = f"{self.hostname}/{task_id}/{uuid.uuid4().hex[:6]}"
        work: LeasedWork = ChunkWork(job_id, chunk) if repair is None else RepairWork(job_id, repair)
        self.held.add(1)
        try:
            outcome = run_leased(self.ctx, work, owner)
        except Exception as exc:
            return self.failures.outcome_of(exc, job_id, chunk, queue, repair)
        finally:
            self.held.add(-1)
            self.prefetch.nudge()  # before the ack: it must not pull in a chunk nobody wants yet
        log.info(
            "chunk %d of job %s: %s %s (%d ok, %d failed, %d tokens, %.1fs)",
            chunk,
            job_id,
            outcome.status,
            outcome.reason,
            outcome.samples_ok,
            outcome.samples_failed,
            outcome.completion_tokens,
            outcome.seconds,
        )
        return outcome
