"""The one runner of leased work: a chunk's first pass and its repair rounds, under the chunk's lease.

:func:`run_leased` holds the skeleton both share, so that whatever one reports the other reports
too: the checks before the lease, the lease (taken, kept alive, given back when the work does not
run or fails, dropped at the end), the pause read with the lease held, the listeners' events
(``chunk_started``, ``sample_done`` for every finished sample, ``chunk_stored``), cancelling a
failed work's pending requests, and the model checked again before storing. What differs is a
:class:`LeasedWork`: :class:`~workers.chunk_runner.ChunkWork` or
:class:`~workers.repair_runner.RepairWork`. The steps their stores share are here too
(:func:`checked_records`, :func:`write_once`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache, JobHandle, UnknownChunk
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.quality import with_checks
from dflash_tasks.core.record import Record, encode_records
from dflash_tasks.core.spec_stats import SampleCounts
from dflash_tasks.core.states import Cause, Delivery, JobState
from workers.checks.loss_counting import LossCountCache
from workers.flow.request_pool import RequestPool
from workers.generate.identity import ServerModel
from workers.generation import RetryPolicy, WorkerIdentity
from workers.monitor.listener import NO_LISTENER, WorkerListener
from workers.recovery.leases import LeaseKeeper
from workers.recovery.retrying import retry_transient
from workers.sglang_client import SGLangClient

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ChunkContext:
    """What a worker process shares between the chunks (and repair rounds) it runs."""

    client: SGLangClient
    pool: RequestPool  # the server's in-flight budget, shared by every chunk the worker holds
    bookkeeping: Bookkeeping
    jobs: JobCache
    leases: LeaseKeeper
    policy: RetryPolicy
    identity: WorkerIdentity
    lease_seconds: float
    store_retry_seconds: float  # how long the chunk's store write, then its completion, are retried
    server: ServerModel  # what the server serves: a chunk of another model is never generated
    listener: WorkerListener = NO_LISTENER  # metrics and live progress (workers.monitor.listener)
    loss_counts: LossCountCache = dataclasses.field(default_factory=LossCountCache)


class LeasedWork(Protocol):
    """A piece of a job that runs under its chunk's lease and stores one file, write-once."""

    @property
    def job_id(self) -> str: ...

    @property
    def chunk(self) -> int: ...

    @property
    def rid_stem(self) -> str:
        """How its request ids start (the owner's nonce and a counter follow)."""
        ...

    def needless(self, job: JobHandle) -> DeliveryOutcome | None:
        """Why it need not run (stored already, nothing to build on), else None; asked before the
        lease is taken and again once it is held."""
        ...

    def start(
        self, ctx: ChunkContext, job: JobHandle, rid_prefix: str
    ) -> list[Future[Record]] | DeliveryOutcome:
        """Put its conversations into the request pool; an outcome when nothing is left to generate."""
        ...

    def counts(self, index: int, record: Record) -> SampleCounts:
        """What the record of its ``index``-th conversation adds to the listeners' counters."""
        ...

    def store(
        self, ctx: ChunkContext, job: JobHandle, records: list[Record], started: float
    ) -> DeliveryOutcome:
        """Check, write and count the generated ``records``; ``started``: when the lease was taken."""
        ...


def job_of_chunk(ctx: ChunkContext, job_id: str, chunk: int) -> JobHandle:
    """The job of a delivered chunk; :class:`UnknownChunk` for a number outside it (retrying a
    chunk that does not exist never ends)."""
    job = ctx.jobs.get(job_id)
    if not 0 <= chunk < job.manifest.chunks:
        raise UnknownChunk(f"job {job_id} has no chunk {chunk} (it has {job.manifest.chunks})")
    return job


def run_leased(ctx: ChunkContext, work: LeasedWork, owner: str) -> DeliveryOutcome:
    """Run ``work`` under its chunk's lease unless it is needless or running elsewhere.

    Raises :class:`ServerUnavailable` (nothing stored, lease released) when the server dies,
    :class:`WrongModel` (nothing generated or stored) when the server does not serve the job's
    model, before the first request or after the last one, and :class:`UnknownChunk` for a chunk
    number outside the job.
    """
    job = job_of_chunk(ctx, work.job_id, work.chunk)
    needless = work.needless(job)
    if needless is not None:
        return needless
    ctx.server.check(job.definition.spec.model)
    if not ctx.bookkeeping.acquire(work.job_id, work.chunk, owner, ctx.lease_seconds):
        return DeliveryOutcome(Delivery.SKIPPED, "running elsewhere (live lease)", Cause.LEASED_ELSEWHERE)
    started = time.monotonic()
    ctx.leases.hold(work.job_id, work.chunk, owner)
    ctx.listener.chunk_started(work.job_id)
    try:
        outcome = _run_held(ctx, work, job, owner, started)
    except BaseException:
        ctx.leases.drop(work.job_id, work.chunk)
        try:
            ctx.bookkeeping.release(work.job_id, work.chunk, owner)
        except Exception:  # the lease expires on its own; the reconciler re-queues the chunk
            log.warning("could not release the lease of chunk %s of job %s", work.chunk, work.job_id)
        raise
    finally:
        ctx.leases.drop(work.job_id, work.chunk)
    if outcome.status == Delivery.DONE:
        ctx.listener.chunk_stored(work.job_id, outcome.seconds)
    return outcome


def _run_held(
    ctx: ChunkContext, work: LeasedWork, job: JobHandle, owner: str, started: float
) -> DeliveryOutcome:
    """The work with its lease held: checked again, generated, stored. The lease is given back
    when it does not run (stored meanwhile by another worker, the job paused, nothing to generate)."""
    skip = work.needless(job) or _paused(ctx, work.job_id)
    futures = skip or work.start(ctx, job, f"{work.rid_stem}-{owner.rsplit('/', 1)[-1]}")
    if isinstance(futures, DeliveryOutcome):
        ctx.leases.drop(work.job_id, work.chunk)
        ctx.bookkeeping.release(work.job_id, work.chunk, owner)
        return futures
    # Each conversation goes through the shared pool; the work is stored (and counted, exactly
    # once) when every one of them is done.
    for index, future in enumerate(futures):
        future.add_done_callback(
            report_sample(ctx.listener, work.job_id, functools.partial(work.counts, index))
        )
    records = collect_records(futures)
    ctx.server.confirm(job.definition.spec.model)  # the server may have restarted with another model
    return work.store(ctx, job, records, started)


def _paused(ctx: ChunkContext, job_id: str) -> DeliveryOutcome | None:
    """The outcome for a paused job, read with the lease held: a producer that paused the job and
    then saw no live lease (a failed preflight deleting its chunks' outputs) can rely on no work
    starting after it. Resume (or a re-run of enqueue) queues it again."""
    state, reason = ctx.bookkeeping.job_state(job_id)
    return DeliveryOutcome(Delivery.PAUSED, reason) if state == JobState.PAUSED else None


def collect_records(futures: list[Future[Record]]) -> list[Record]:
    """Results in input order; on any failure, cancel what has not started and re-raise.

    A chunk that will not be stored must not keep the shared request pool busy.
    """
    records: list[Record] = []
    try:
        for fut in futures:
            records.append(fut.result())
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return records


def report_sample(
    listener: WorkerListener, job_id: str, counts: Callable[[Record], SampleCounts]
) -> Callable[[Future[Record]], None]:
    """A done-callback for a sample's future: its ``counts``, read once, to ``listener.sample_done``."""

    def done(future: Future[Record]) -> None:
        if not future.cancelled() and future.exception() is None:
            listener.sample_done(job_id, counts(future.result()))

    return done


def checked_records(
    ctx: ChunkContext, job: JobHandle, job_id: str, generated: list[Record], where: str
) -> list[Record]:
    """Each record checked against the job's quality settings, and its loss tokens counted with the
    served model's tokenizer where this worker can (:mod:`workers.checks.loss_counting`; ``where``:
    the chunk or round, for its log)."""
    quality, thinking = job.definition.quality, job.definition.spec.thinking
    records = [with_checks(r, thinking, quality) for r in generated]
    return ctx.loss_counts.counted(job_id, job.definition, served_model_path(ctx), records, where)


def served_model_path(ctx: ChunkContext) -> str | None:
    """The model directory the bound server reports having loaded, when known."""
    served = ctx.server.current
    return served.model_path if served is not None else None


def write_once(
    ctx: ChunkContext, job: JobHandle, key: str, records: list[Record], where: str, started: float
) -> DeliveryOutcome | None:
    """Write ``records`` to ``key``, write-once; None when written, the outcome when another worker
    stored it meanwhile (theirs is kept).

    The write is retried in place on transient trouble (a full disk, S3 unreachable) for
    ``ctx.store_retry_seconds``, the lease kept alive meanwhile: the generated records are not
    thrown away. ``write_new`` is True when the key already holds these very bytes, so a retry
    after a write that landed unseen (a lost S3 response, an error after the link) counts as ours.
    """
    data = encode_records(records)
    write = functools.partial(job.store.write_new, key, data)
    if retry_transient(write, f"storing {where}", ctx.store_retry_seconds, ctx.policy):
        return None
    # This worker ran past its lease (frozen, or cut off from Redis) and the work was taken over.
    log.warning("%s was stored by another worker meanwhile: keeping theirs", where)
    return DeliveryOutcome(
        Delivery.SKIPPED,
        "stored meanwhile by another worker",
        Cause.ALREADY_DONE,
        seconds=time.monotonic() - started,
    )
