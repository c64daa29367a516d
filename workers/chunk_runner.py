"""Running one chunk: the plain function behind the Celery task (testable without a broker)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache, JobHandle, UnknownChunk
from dflash_tasks.core.job import input_key, output_key
from dflash_tasks.core.quality import judged, with_checks
from dflash_tasks.core.record import Record, encode_records
from dflash_tasks.core.sample import decode_chunk
from dflash_tasks.core.spec_stats import sample_counts
from dflash_tasks.core.states import Cause, Delivery, JobState
from workers.checks.live_gate import record_chunk_and_judge
from workers.checks.loss_counting import LossCountCache
from workers.flow.request_pool import RequestPool
from workers.generate.conversation import start_conversation
from workers.generate.identity import ServerModel
from workers.generation import RetryPolicy, WorkerIdentity
from workers.monitor.listener import NO_LISTENER, WorkerListener
from workers.recovery.leases import LeaseKeeper
from workers.recovery.retrying import retry_transient
from workers.sglang_client import SGLangClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What happened to a chunk delivery."""

    status: Delivery  # DONE, SKIPPED or PAUSED
    reason: str = ""
    cause: Cause = Cause.NONE
    samples_ok: int = 0
    samples_failed: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "reason": self.reason,
            "cause": self.cause.value,
            "samples_ok": self.samples_ok,
            "samples_failed": self.samples_failed,
            "completion_tokens": self.completion_tokens,
            "seconds": round(self.seconds, 3),
        }


@dataclass(slots=True)
class ChunkContext:
    """What a worker process shares between the chunks it runs."""

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


def job_of_chunk(ctx: ChunkContext, job_id: str, chunk: int) -> JobHandle:
    """The job of a delivered chunk; :class:`UnknownChunk` for a number outside it (retrying a
    chunk that does not exist never ends)."""
    job = ctx.jobs.get(job_id)
    if not 0 <= chunk < job.manifest.chunks:
        raise UnknownChunk(f"job {job_id} has no chunk {chunk} (it has {job.manifest.chunks})")
    return job


def run_chunk(ctx: ChunkContext, job_id: str, chunk: int, owner: str) -> ChunkOutcome:
    """Generate and store ``chunk`` of ``job_id`` unless it is done or running elsewhere.

    Raises :class:`ServerUnavailable` (nothing stored, lease released) when the server dies,
    :class:`WrongModel` (nothing generated or stored) when the server does not serve the job's
    model, before the first request or after the last one, and :class:`UnknownChunk` for a chunk
    number outside the job.
    """
    job = job_of_chunk(ctx, job_id, chunk)
    out_key = output_key(chunk)
    if job.store.exists(out_key):
        return ChunkOutcome(Delivery.SKIPPED, "already done", Cause.ALREADY_DONE)
    model = job.definition.spec.model
    ctx.server.check(model)
    if not ctx.bookkeeping.acquire(job_id, chunk, owner, ctx.lease_seconds):
        return ChunkOutcome(Delivery.SKIPPED, "running elsewhere (live lease)", Cause.LEASED_ELSEWHERE)
    started = time.monotonic()
    ctx.leases.hold(job_id, chunk, owner)
    ctx.listener.chunk_started(job_id)
    try:
        if job.store.exists(out_key):  # finished by another worker between the check and the lease
            ctx.bookkeeping.release(job_id, chunk, owner)
            return ChunkOutcome(Delivery.SKIPPED, "already done", Cause.ALREADY_DONE)
        # Checked with the lease held: a producer that paused the job and then saw no live lease
        # (a failed preflight deleting its chunks' outputs) can rely on no chunk starting after it.
        state, reason = ctx.bookkeeping.job_state(job_id)
        if state == JobState.PAUSED:  # resume (or a re-run of enqueue) queues the chunk again
            ctx.bookkeeping.release(job_id, chunk, owner)
            return ChunkOutcome(Delivery.PAUSED, reason)
        samples = decode_chunk(job.store.read(input_key(chunk)), input_key(chunk))
        spec = job.definition.spec
        rid_prefix = f"{job_id}-{chunk}-{owner.rsplit('/', 1)[-1]}"
        # Each sample's turns go through the shared pool one after the other; the chunk is stored
        # (and counted, exactly once) when every turn of every sample is done.
        who = dataclasses.replace(ctx.identity, server=ctx.server.current)  # what the records name
        futures = [
            start_conversation(
                ctx.pool, ctx.client, spec, s, who, ctx.policy, rid_prefix, listener=ctx.listener
            )
            for s in samples
        ]
        for fut in futures:
            fut.add_done_callback(_report_sample(ctx.listener, job_id))
        records = collect_records(futures)
        ctx.server.confirm(model)  # the server may have restarted with another model meanwhile
        outcome = _store_chunk(ctx, job, job_id, chunk, records, started)
        if outcome.status == Delivery.DONE:
            ctx.listener.chunk_stored(job_id, outcome.seconds)
        return outcome
    except BaseException:
        try:
            ctx.bookkeeping.release(job_id, chunk, owner)
        except Exception:  # the lease expires on its own; the reconciler re-queues the chunk
            log.warning("could not release the lease of chunk %s of job %s", chunk, job_id)
        raise
    finally:
        ctx.leases.drop(job_id, chunk)


def _store_chunk(
    ctx: ChunkContext, job: JobHandle, job_id: str, chunk: int, generated: list[Record], started: float
) -> ChunkOutcome:
    """Check each turn, write the chunk atomically, count it once, and feed the live gate.

    The write and then the completion are each retried in place on transient trouble (a full disk,
    S3 or Redis unreachable) for ``ctx.store_retry_seconds``, the lease kept alive meanwhile: the
    generated records are not thrown away, and a stored chunk is counted through a Redis restart.
    """
    quality = job.definition.quality
    thinking = job.definition.spec.thinking
    records = [with_checks(r, thinking, quality) for r in generated]
    served = ctx.server.current
    model_path = served.model_path if served is not None else None
    records = ctx.loss_counts.counted(job_id, job.definition, model_path, records)
    gated = judged(records)  # the live gate leaves transient failures to the repair rounds
    checks: Counter[str] = Counter()
    for record in gated:
        checks.update(record.checks or ())
    data = encode_records(records)
    where = f"chunk {chunk} of job {job_id}"

    def retried(step: Callable[[], bool], doing: str) -> bool:
        return retry_transient(step, f"{doing} {where}", ctx.store_retry_seconds, ctx.policy)

    # write_new is write-once and True when the key already holds these very bytes, so a retry
    # after a write that landed unseen (a lost S3 response, an error after the link) counts as ours.
    if not retried(lambda: job.store.write_new(output_key(chunk), data), "storing"):
        # Stored meanwhile by another worker: this one ran past its lease (frozen, or cut off from
        # Redis) and the chunk was taken over. A stored chunk never changes: keep that one.
        log.warning(
            "chunk %s of job %s was stored by another worker meanwhile: keeping theirs", chunk, job_id
        )
        return ChunkOutcome(
            Delivery.SKIPPED,
            "stored meanwhile by another worker",
            Cause.ALREADY_DONE,
            seconds=time.monotonic() - started,
        )
    each = [sample_counts(r) for r in records]
    ok = sum(c.ok for c in each)
    tokens = sum(c.completion_tokens for c in each)
    counters = {
        "samples_ok": ok,
        "samples_failed": len(records) - ok,
        "completion_tokens": tokens,
        "prompt_tokens": sum(c.prompt_tokens for c in each),
        "spec_tokens": sum(c.spec_tokens for c in each),
        "spec_verify_ct": sum(c.verify for c in each),
        "turns": sum(c.turns for c in each),
        "generations": sum(c.generations for c in each),
        "chunk_seconds": time.monotonic() - started,
        **{f"check_{name}": n for name, n in _all_checks(records).items()},
    }
    if retried(lambda: ctx.bookkeeping.complete(job_id, chunk, counters), "recording as done"):
        record_chunk_and_judge(ctx.bookkeeping, job_id, len(gated), checks, quality)
    return ChunkOutcome(
        Delivery.DONE, "", Cause.NONE, ok, len(records) - ok, tokens, time.monotonic() - started
    )


def _all_checks(records: list[Record]) -> Counter[str]:
    """How many records fail each check, transient failures included (the job's counters)."""
    counts: Counter[str] = Counter()
    for record in records:
        counts.update(record.checks or ())
    return counts


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


def _report_sample(listener: WorkerListener, job_id: str) -> Callable[[Future[Record]], None]:
    """A done-callback for a sample's future: its counts, read once, to ``listener.sample_done``."""

    def done(future: Future[Record]) -> None:
        if not future.cancelled() and future.exception() is None:
            listener.sample_done(job_id, sample_counts(future.result()))

    return done
