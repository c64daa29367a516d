"""Putting a worker's chunks back on their model's queue, and re-planning a job from the store."""

from __future__ import annotations

import logging

from celery import Celery
from celery.exceptions import Reject

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache
from dflash_tasks.coord.planner import plan_job
from dflash_tasks.coord.publish import publish_chunks, publish_repairs
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.progress_writer import job_needs_progress

log = logging.getLogger(__name__)


class Requeuer:
    """Re-queues one chunk, or every missing chunk of a job, on the job's model queue."""

    def __init__(
        self, settings: CommonSettings, bookkeeping: Bookkeeping, jobs: JobCache, app: Celery
    ) -> None:
        self.settings = settings
        self.bookkeeping = bookkeeping
        self.jobs = jobs
        self.app = app

    def job_queue(self, job_id: str, fallback: str = "") -> str:
        """The job's model queue; ``fallback`` (the queue a delivery came from) if the job cannot be read."""
        try:
            return model_queue(self.settings.queue, self.jobs.get(job_id).definition.spec.model)
        except DflashError:
            if not fallback:
                raise
            return fallback

    def requeue(
        self,
        job_id: str,
        chunk: int,
        countdown: float | None = None,
        fallback: str = "",
        repair: RepairUnit | None = None,
    ) -> str:
        """Queue the chunk (or its ``repair`` round) again on its model's queue (returned); if even
        that fails, reject the delivery so the broker keeps it."""
        try:
            queue = self.job_queue(job_id, fallback)
            if repair is not None:
                publish_repairs(self.app, job_id, [repair], queue=queue, countdown=countdown)
            else:
                publish_chunks(self.app, job_id, [chunk], queue=queue, countdown=countdown)
            return queue
        except Exception as exc:
            log.error(
                "could not re-queue chunk %d of job %s (%s): returning it to the broker", chunk, job_id, exc
            )
            raise Reject(f"could not re-queue: {exc}", requeue=True) from exc

    def replan_job(self, job_id: str) -> list[int]:
        """Queue what a job is missing (see :meth:`Reconciler._replan_all`); returns those chunks.

        A finished job leaves the registry once its final progress.json is written (the writers
        only write registered jobs: unregistered earlier, a job run without ``enqueue --wait``
        would keep a "running" progress.json forever); a paused job is left alone (its chunks
        wait for resume).
        """
        job = self.jobs.get(job_id)
        if self.bookkeeping.job_state(job_id)[0] != JobState.RUNNING:  # paused, or in its preflight
            return []
        queue = model_queue(self.settings.queue, job.definition.spec.model)
        plan = plan_job(
            job.store,
            self.bookkeeping,
            queue,
            job_id,
            job.manifest.chunks,
            self.settings.lease_seconds,
            claim_expired=False,  # the reconciler's lease path re-queues those
        )
        if len(plan.done) >= job.manifest.chunks:
            if not job_needs_progress(self.bookkeeping, job_id):
                self.bookkeeping.finish_job(job_id)
            return []
        parked = self.bookkeeping.parked(job_id)
        missing = [c for c in plan.to_enqueue if c not in parked]
        if missing:
            publish_chunks(self.app, job_id, missing, queue=queue)
        return missing
