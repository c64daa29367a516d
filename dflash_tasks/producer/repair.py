"""Repair rounds: regenerate the samples a passing fault failed, once every chunk is stored.

A re-run of ``enqueue`` queues one round for each stored chunk that holds such samples (with
``--retry-failed``, any failed sample); ``enqueue --wait`` runs up to ``repair_rounds`` rounds by
itself, ``repair_spacing_seconds`` apart, and waits for each. A round goes through the same queue,
workers, leases and routing as the chunks (:mod:`workers.repair_runner`) and writes a write-once
file per chunk; the chunk files never change. A chunk whose round runs or waits is never queued
twice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.planner import repairs_in_flight
from dflash_tasks.coord.publish import publish_repairs
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.job import JobDefinition, Manifest
from dflash_tasks.core.repair import RepairUnit, needs_repair
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.store import Store
from dflash_tasks.store.records import list_outputs, read_current


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What a repair round would do now, read from the store (and Redis, for what is in flight)."""

    stored: bool  # every chunk is stored (no round runs before)
    pending: dict[int, int] = field(default_factory=dict)  # chunk -> samples a round regenerates
    failed_permanent: int = 0  # samples failed permanently, left alone without --retry-failed
    busy: frozenset[int] = frozenset()  # chunks whose round runs or waits
    to_queue: tuple[RepairUnit, ...] = ()

    @property
    def samples(self) -> int:
        return sum(self.pending.values())


def plan_repairs(
    store: Store,
    manifest: Manifest,
    bookkeeping: Bookkeeping | None,
    queue: str,
    job_id: str,
    *,
    permanent: bool = False,
    lease_grace: float = 60.0,
    only: Iterable[int] | None = None,
) -> RepairPlan:
    """Plan the next round of every stored chunk (of those in ``only``, if given) with samples to
    regenerate; with ``bookkeeping=None`` (a dry run) nothing counts as in flight.

    Reads each such chunk's current records once (one pass over the outputs, as ``verify``).
    """
    listing = list_outputs(store)
    if any(c not in listing.chunks for c in range(manifest.chunks)):
        return RepairPlan(stored=False)
    chunks = sorted(set(range(manifest.chunks)) if only is None else set(only))
    pending: dict[int, int] = {}
    permanent_left = 0
    for chunk in chunks:
        records = read_current(store, chunk, listing.rounds_of(chunk))
        n = sum(needs_repair(r, permanent) for r in records)
        permanent_left += sum(not r.ok and not r.transient for r in records)
        if n:
            pending[chunk] = n
    busy: frozenset[int] = frozenset()
    if bookkeeping is not None and pending:
        busy = frozenset(repairs_in_flight(bookkeeping, queue, job_id, lease_grace) & set(pending))
    to_queue = tuple(
        RepairUnit(c, listing.last_round(c) + 1, permanent) for c in sorted(pending) if c not in busy
    )
    return RepairPlan(True, pending, 0 if permanent else permanent_left, busy, to_queue)


def queue_repairs(
    store: Store,
    manifest: Manifest,
    bookkeeping: Bookkeeping,
    app: Celery,
    settings: ProducerSettings,
    job: JobDefinition,
    *,
    permanent: bool = False,
    only: Iterable[int] | None = None,
) -> RepairPlan:
    """Plan the next round and queue it on the job's model queue (what a re-run of enqueue does)."""
    queue = model_queue(settings.queue, job.spec.model)
    plan = plan_repairs(
        store,
        manifest,
        bookkeeping,
        queue,
        job.job_id,
        permanent=permanent,
        lease_grace=settings.lease_seconds,
        only=only,
    )
    publish_repairs(app, job.job_id, plan.to_queue, queue=queue)
    return plan


def run_repair_rounds(
    store: Store,
    manifest: Manifest,
    bookkeeping: Bookkeeping,
    app: Celery,
    settings: ProducerSettings,
    job: JobDefinition,
    *,
    permanent: bool = False,
    say: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[RepairPlan, int]:
    """``enqueue --wait`` after the chunks: up to ``settings.repair_rounds`` rounds, each waited for.

    Returns the plan left after the last round (its ``pending`` samples stay failed, counted) and
    the rounds run. Stops early when the job is paused.
    """
    tell = say or (lambda text: print(text, file=sys.stderr, flush=True))
    queue = model_queue(settings.queue, job.spec.model)
    plan = plan_repairs(
        store,
        manifest,
        bookkeeping,
        queue,
        job.job_id,
        permanent=permanent,
        lease_grace=settings.lease_seconds,
    )
    rounds = 0
    while plan.stored and plan.pending and rounds < settings.repair_rounds:
        if bookkeeping.job_state(job.job_id)[0] == JobState.PAUSED:
            break
        kind = "failed" if permanent else "failed by a passing cause"
        tell(
            f"repair round {rounds + 1} of at most {settings.repair_rounds}: {plan.samples:,} samples {kind} "
            f"in {len(plan.pending):,} chunks, regenerated in {settings.repair_spacing_seconds:.0f}s"
        )
        sleep(settings.repair_spacing_seconds)
        chunks = set(plan.pending)
        queue_repairs(store, manifest, bookkeeping, app, settings, job, permanent=permanent, only=chunks)
        while repairs_in_flight(bookkeeping, queue, job.job_id, settings.lease_seconds) & chunks:
            sleep(1.0)
        rounds += 1
        plan = plan_repairs(
            store,
            manifest,
            bookkeeping,
            queue,
            job.job_id,
            permanent=permanent,
            lease_grace=settings.lease_seconds,
            only=chunks,
        )
    if rounds:
        left = f"{plan.samples:,} still failed" if plan.samples else "none left failed"
        tell(f"repair: {rounds} rounds run; {left} by a passing cause")
    return plan, rounds
