"""Planning: which chunks still need a message, computed from the store (the truth) and Redis.

A chunk needs a message unless its completions are stored, a live lease says it is running,
or a message for it already waits in the broker queue. Chunks whose lease expired (their
worker died) are claimed here and queued again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.publish import (
    publish_chunks,
    queued_chunks,
    queued_repairs,
    unacked_chunks,
    unacked_repairs,
)
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.store import Store
from dflash_tasks.store.jobfiles import done_chunks


@dataclass(frozen=True, slots=True)
class Plan:
    chunks: int
    done: frozenset[int]
    running: frozenset[int]
    queued: frozenset[int]
    to_enqueue: tuple[int, ...]

    @property
    def pending(self) -> int:
        """Chunks not yet done (queued, running or about to be queued)."""
        return self.chunks - len(self.done)


def plan_job(
    store: Store,
    bookkeeping: Bookkeeping | None,
    queue: str,
    job_id: str,
    chunks: int,
    lease_grace: float = 60.0,
    claim_expired: bool = True,
) -> Plan:
    """Plan ``job_id``; with ``bookkeeping=None`` (a dry run) Redis is not consulted.

    ``queue``: the job's model queue (:func:`~dflash_tasks.coord.routing.model_queue`).
    ``lease_grace``: how long a live worker may hold a delivery before leasing it (the lease time).
    ``claim_expired``: take over expired leases and plan their chunks (the producer); False
    leaves them to the live workers' reconciler, whose lease path re-queues them (a worker's own
    re-plan), so each chunk has one way back.
    """
    done = frozenset(c for c in done_chunks(store) if c < chunks)
    running: frozenset[int] = frozenset()
    queued: frozenset[int] = frozenset()
    if bookkeeping is not None:
        if claim_expired:
            for chunk in bookkeeping.expired_leases(job_id):
                bookkeeping.claim_expired(job_id, chunk)
            running = frozenset(bookkeeping.live_leases(job_id))
        else:
            running = frozenset(bookkeeping.owners(job_id))  # live or expired: the lease path's
        # Waiting in the queue, or delivered to a live worker that has not leased it yet
        # (e.g. a re-queued chunk waiting for its countdown).
        held = unacked_chunks(bookkeeping.client, job_id, time.time(), lease_grace)
        queued = frozenset(queued_chunks(bookkeeping.client, queue, job_id) | held)
    to_enqueue = tuple(c for c in range(chunks) if c not in done and c not in running and c not in queued)
    return Plan(chunks, done, running - done, queued - done - running, to_enqueue)


def repairs_in_flight(
    bookkeeping: Bookkeeping, queue: str, job_id: str, lease_grace: float = 60.0
) -> set[int]:
    """Chunks of ``job_id`` a repair round runs or waits for: a live lease (the chunk is stored, so a
    lease is a repair's), or a repair message queued on ``queue`` or held by a live worker."""
    busy = set(bookkeeping.live_leases(job_id))
    busy |= {chunk for chunk, _ in queued_repairs(bookkeeping.client, queue, job_id)}
    busy |= {chunk for chunk, _ in unacked_repairs(bookkeeping.client, job_id, time.time(), lease_grace)}
    return busy


def queue_missing(
    store: Store,
    bookkeeping: Bookkeeping,
    app: Celery,
    settings: CommonSettings,
    job_id: str,
    chunks: int,
    model: str,
    only: Iterable[int] | None = None,
    exclude: Iterable[int] = (),
) -> tuple[Plan, int]:
    """Register the job, plan it and queue what is missing on ``model``'s queue (only chunks in
    ``only``, if given, never those in ``exclude``, e.g. parked chunks).

    Returns the plan and how many messages were sent. Used by enqueue, its ``--wait`` loop,
    the preflight and resume, so they all agree on what "missing" means.
    """
    queue = model_queue(settings.queue, model)
    bookkeeping.register_job(job_id, registered_location(store))
    plan = plan_job(store, bookkeeping, queue, job_id, chunks, settings.lease_seconds)
    bookkeeping.mark_done(job_id, plan.done)
    keep = set(plan.to_enqueue) - set(exclude)
    if only is not None:
        keep &= set(only)
    return plan, publish_chunks(app, job_id, [c for c in plan.to_enqueue if c in keep], queue=queue)


def registered_location(store: Store) -> str:
    """Where workers find the store: absolute for a local directory."""
    root = getattr(store, "root", None)
    return str(root) if root is not None else store.uri
