"""Repair rounds: regenerate the samples a passing fault failed, once every chunk is stored.

A re-run of ``enqueue`` queues one round for each stored chunk that holds such samples (with
``--retry-failed``, any failed sample); ``enqueue --wait`` runs up to ``repair_rounds`` rounds by
itself, ``repair_spacing_seconds`` apart, and waits for each. A round goes through the same queue,
workers, leases and routing as the chunks (:mod:`workers.repair_runner`) and writes a write-once
file per chunk; the chunk files never change. A chunk whose round runs or waits is never queued
twice. A sample stopped in a loop is regenerated too where the job's ``--on-loop`` says so
(:mod:`dflash_tasks.core.on_loop`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.celery_app import app as celery_app
from dflash_tasks.coord.celery_app import configure
from dflash_tasks.coord.planner import repairs_in_flight
from dflash_tasks.coord.publish import publish_repairs
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.continuation import is_cut_thought
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.job import JobDefinition, Manifest
from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.repair import RepairUnit, needs_repair, to_continue, truncated_below
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.progress_writer import ProgressWriter
from dflash_tasks.producer.outage import ride_out
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.records import list_outputs, read_current

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What a repair round would do now, read from the store (and Redis, for what is in flight)."""

    stored: bool  # every chunk is stored (no round runs before)
    pending: dict[int, int] = field(default_factory=dict)  # chunk -> samples a round regenerates
    failed_permanent: int = 0  # samples failed permanently, left alone without --retry-failed
    truncated: int = 0  # of the pending: truncated at a budget below ``max_tokens``, regenerated
    max_tokens: int | None = None  # the job's budget for truncated samples (its amendment)
    continued: int = 0  # of the pending: cut thoughts continued up to the horizon (or max_tokens)
    continued_tokens: int = 0  # the most new tokens their continuations may generate
    busy: frozenset[int] = frozenset()  # chunks whose round runs or waits
    to_queue: tuple[RepairUnit, ...] = ()
    looped: int = 0  # of the pending: samples stopped in a loop, regenerated (--on-loop)

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
    max_tokens: int | None = None,
    lease_grace: float = 60.0,
    only: Iterable[int] | None = None,
    horizon: int | None = None,
    on_loop: OnLoop | None = None,
) -> RepairPlan:
    """Plan the next round of every stored chunk (of those in ``only``, if given) with samples to
    regenerate or continue; with ``bookkeeping=None`` (a dry run) nothing counts as in flight.
    ``max_tokens``: the job's budget for truncated samples (``JobDefinition.repair_max_tokens``);
    ``horizon``: the trainer's ``max_length``, up to which cut thoughts are continued; ``on_loop``:
    the job's policy for samples stopped in a loop (None: none is regenerated).

    Reads each such chunk's current records once (one pass over the outputs, as ``verify``).
    """
    listing = list_outputs(store)
    if any(c not in listing.chunks for c in range(manifest.chunks)):
        return RepairPlan(stored=False)
    chunks = sorted(set(range(manifest.chunks)) if only is None else set(only))
    pending: dict[int, int] = {}
    permanent_left = truncated = continued = continued_tokens = looped = 0
    for chunk in chunks:
        records = read_current(store, chunk, listing.rounds_of(chunk))
        n = sum(needs_repair(r, permanent, max_tokens, horizon, on_loop) for r in records)
        looped += sum(on_loop is not None and on_loop.regenerates(r) for r in records)
        budgets = [to_continue(r, max_tokens, horizon) for r in records]
        continued += sum(b > 0 for b in budgets)
        continued_tokens += sum(budgets)
        truncated += sum(
            r.ok and not is_cut_thought(r.turns[-1]) and truncated_below(r, max_tokens) for r in records
        )
        permanent_left += sum(not r.ok and not r.transient for r in records)
        if n:
            pending[chunk] = n
    busy: frozenset[int] = frozenset()
    if bookkeeping is not None and pending:
        busy = frozenset(repairs_in_flight(bookkeeping, queue, job_id, lease_grace) & set(pending))
    to_queue = tuple(
        RepairUnit(c, listing.last_round(c) + 1, permanent, max_tokens)
        for c in sorted(pending)
        if c not in busy
    )
    left = 0 if permanent else permanent_left
    return RepairPlan(
        True, pending, left, truncated, max_tokens, continued, continued_tokens, busy, to_queue, looped
    )


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
    plan = job_repair_plan(store, manifest, bookkeeping, settings, job, permanent=permanent, only=only)
    publish_repairs(app, job.job_id, plan.to_queue, queue=model_queue(settings.queue, job.spec.model))
    return plan


def job_repair_plan(
    store: Store,
    manifest: Manifest,
    bookkeeping: Bookkeeping,
    settings: ProducerSettings,
    job: JobDefinition,
    *,
    permanent: bool = False,
    only: Iterable[int] | None = None,
) -> RepairPlan:
    """:func:`plan_repairs` for ``job`` on its model's queue, with its amendment's budget."""
    return plan_repairs(
        store,
        manifest,
        bookkeeping,
        model_queue(settings.queue, job.spec.model),
        job.job_id,
        permanent=permanent,
        max_tokens=job.repair_max_tokens,
        lease_grace=settings.lease_seconds,
        only=only,
        horizon=job.trainer.max_length,
        on_loop=job.quality.on_loop,
    )


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
    tell = say or _to_stderr
    queue = model_queue(settings.queue, job.spec.model)

    def replan(only: Iterable[int] | None) -> RepairPlan:
        return _replan(store, manifest, bookkeeping, settings, job, permanent, only, tell, sleep)

    plan = replan(None)
    rounds = 0
    while plan.stored and plan.pending and rounds < settings.repair_rounds:
        if _paused(bookkeeping, job.job_id, tell, sleep):
            break
        tell(
            f"repair round {rounds + 1} of at most {settings.repair_rounds}: {describe(plan, permanent)} "
            f"in {len(plan.pending):,} chunks, regenerated in {settings.repair_spacing_seconds:.0f}s"
        )
        sleep(settings.repair_spacing_seconds)
        chunks = set(plan.pending)
        _run_round(app, store, bookkeeping, settings, queue, job.job_id, plan, chunks, tell, sleep)
        rounds += 1
        plan = replan(chunks)
    if rounds:
        left = describe(plan, permanent) if plan.samples else "none left"
        tell(f"repair: {rounds} rounds run; {left}")
    return plan, rounds


def _replan(
    store: Store,
    manifest: Manifest,
    bookkeeping: Bookkeeping,
    settings: ProducerSettings,
    job: JobDefinition,
    permanent: bool,
    only: Iterable[int] | None,
    tell: Callable[[str], None],
    sleep: Callable[[float], None],
) -> RepairPlan:
    """:func:`job_repair_plan`, riding out a Redis outage."""
    return ride_out(
        lambda: job_repair_plan(store, manifest, bookkeeping, settings, job, permanent=permanent, only=only),
        "planning a repair round",
        tell,
        sleep,
    )


def _paused(
    bookkeeping: Bookkeeping, job_id: str, tell: Callable[[str], None], sleep: Callable[[float], None]
) -> bool:
    """Whether the job is paused (its state read riding out a Redis outage)."""
    state = ride_out(lambda: bookkeeping.job_state(job_id)[0], "reading the job's state", tell, sleep)
    return state == JobState.PAUSED


def _run_round(
    app: Celery,
    store: Store,
    bookkeeping: Bookkeeping,
    settings: ProducerSettings,
    queue: str,
    job_id: str,
    plan: RepairPlan,
    chunks: set[int],
    tell: Callable[[str], None],
    sleep: Callable[[float], None],
) -> None:
    """Queue the plan's idle units and wait until no round of ``chunks`` runs or waits."""
    ride_out(
        partial(_publish_idle, app, store, bookkeeping, queue, job_id, settings.lease_seconds, plan.to_queue),
        "queueing the repair round",
        tell,
        sleep,
    )
    wait_for_repairs(bookkeeping, queue, job_id, settings.lease_seconds, chunks, sleep=sleep, tell=tell)


def _publish_idle(
    app: Celery,
    store: Store,
    bookkeeping: Bookkeeping,
    queue: str,
    job_id: str,
    lease_grace: float,
    units: Iterable[RepairUnit],
) -> int:
    """Queue the units whose round is neither stored nor in flight (the plan is a spacing old).
    Safe to repeat after a failure part-way: a unit queued then is in flight or stored now."""
    busy = repairs_in_flight(bookkeeping, queue, job_id, lease_grace)
    listing = list_outputs(store)
    idle = [u for u in units if u.chunk not in busy and listing.last_round(u.chunk) < u.round]
    return publish_repairs(app, job_id, idle, queue=queue)


def wait_for_repairs(
    bookkeeping: Bookkeeping,
    queue: str,
    job_id: str,
    lease_grace: float,
    chunks: set[int] | None = None,
    *,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    tell: Callable[[str], None] | None = None,
) -> bool:
    """Until no repair round of ``job_id`` (of ``chunks``, if given) runs or waits, or ``timeout``
    seconds passed; True when none does. Rides out a Redis outage (:func:`ride_out`; ``tell``
    hears of it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        busy = ride_out(
            lambda: repairs_in_flight(bookkeeping, queue, job_id, lease_grace),
            "reading the repair rounds in flight",
            tell or _to_stderr,
            sleep,
        )
        if not (busy if chunks is None else busy & chunks):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        sleep(0.5)


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def describe(plan: RepairPlan, permanent: bool = False) -> str:
    """``N samples failed by a passing cause, T truncated (at most T x B tokens), C cut thoughts
    continued, L looped`` for the plan."""
    failed = plan.samples - plan.truncated - plan.continued - plan.looped
    parts = [f"{failed:,} samples " + ("failed" if permanent else "failed by a passing cause")]
    if plan.looped:
        parts.append(f"{plan.looped:,} stopped in a loop, regenerated with another seed")
    if plan.continued:
        parts.append(
            f"{plan.continued:,} cut thoughts continued (at most {plan.continued_tokens:,} new tokens)"
        )
    if plan.truncated and plan.max_tokens is not None:
        parts.append(
            f"{plan.truncated:,} truncated, regenerated with max_tokens {plan.max_tokens:,} "
            f"(at most {plan.truncated * plan.max_tokens:,} completion tokens)"
        )
    return ", ".join(parts)


def repair_after_wait(
    job: JobDefinition, manifest: Manifest, output: str, settings: ProducerSettings, permanent: bool
) -> RepairPlan:
    """``enqueue --wait`` once every chunk is stored: run the repair rounds and wait for them, and for
    any round an earlier ``enqueue`` queued; then ``progress.json`` once more, with the repaired
    counts (the workers stopped writing it once the job's first pass was final). Returns what is
    left."""
    store = open_store(output, settings)
    bk = Bookkeeping.from_url(settings.broker_url, settings.redis_prefix)
    app = configure(celery_app, settings)
    left, _ = run_repair_rounds(store, manifest, bk, app, settings, job, permanent=permanent)
    queue = model_queue(settings.queue, job.spec.model)
    # a round an earlier enqueue queued; bounded, since this only refreshes progress.json
    wait_for_repairs(bk, queue, job.job_id, settings.lease_seconds, timeout=settings.lease_seconds * 10)
    writer = ProgressWriter(bk, f"enqueue/{os.getpid()}", settings.progress_seconds, settings.queue)
    try:  # the latest figures, whoever ran the rounds
        writer.write(job.job_id, store, manifest, job)
    except DflashError as exc:  # the counters in Redis stay right; status reads them
        log.warning("progress.json not written after the repair rounds: %s", exc)
    return left
