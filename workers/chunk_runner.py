"""Running one chunk's first pass: generate every sample, store the chunk file once, count it once.

The lease, the listeners' events and the checks before and under the lease are the leased-work
runner's (:func:`workers.leased_work.run_leased`); :class:`ChunkWork` says what a chunk adds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from dflash_tasks.coord.jobs_cache import JobHandle
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.job import input_key, output_key
from dflash_tasks.core.on_loop import loop_counters
from dflash_tasks.core.quality import judged
from dflash_tasks.core.record import Record
from dflash_tasks.core.sample import decode_chunk
from dflash_tasks.core.spec_stats import SampleCounts, sample_counts
from dflash_tasks.core.states import Cause, Delivery
from workers.checks.chunk_yield import yield_counters
from workers.checks.live_gate import record_chunk_and_judge
from workers.generate.conversation import start_conversation
from workers.generate.request_budget import request_budget
from workers.leased_work import ChunkContext, checked_records, run_leased, served_model_path, write_once
from workers.recovery.retrying import retry_transient


def run_chunk(ctx: ChunkContext, job_id: str, chunk: int, owner: str) -> DeliveryOutcome:
    """Generate and store ``chunk`` of ``job_id`` unless it is done or running elsewhere (raises as
    :func:`~workers.leased_work.run_leased` does)."""
    return run_leased(ctx, ChunkWork(job_id, chunk), owner)


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """A chunk's first pass (a :class:`~workers.leased_work.LeasedWork`)."""

    job_id: str
    chunk: int

    @property
    def rid_stem(self) -> str:
        return f"{self.job_id}-{self.chunk}"

    def needless(self, job: JobHandle) -> DeliveryOutcome | None:
        if job.store.exists(output_key(self.chunk)):
            return DeliveryOutcome(Delivery.SKIPPED, "already done", Cause.ALREADY_DONE)
        return None

    def start(self, ctx: ChunkContext, job: JobHandle, rid_prefix: str) -> list[Future[Record]]:
        """Each sample's turns go through the shared pool one after the other."""
        samples = decode_chunk(job.store.read(input_key(self.chunk)), input_key(self.chunk))
        spec = job.definition.spec
        who = dataclasses.replace(ctx.identity, server=ctx.server.current)  # what the records name
        budget = request_budget(ctx.loss_counts, self.job_id, job.definition, who.server)
        return [
            start_conversation(
                ctx.pool,
                ctx.client,
                spec,
                s,
                who,
                ctx.policy,
                rid_prefix,
                listener=ctx.listener,
                budget=budget,
                repetition=job.definition.quality.repetition,
            )
            for s in samples
        ]

    def counts(self, index: int, record: Record) -> SampleCounts:
        return sample_counts(record)

    def store(
        self, ctx: ChunkContext, job: JobHandle, records: list[Record], started: float
    ) -> DeliveryOutcome:
        return _store_chunk(ctx, job, self.job_id, self.chunk, records, started)


def _store_chunk(
    ctx: ChunkContext, job: JobHandle, job_id: str, chunk: int, generated: list[Record], started: float
) -> DeliveryOutcome:
    """Check each turn, write the chunk atomically, count it once, and feed the live gate.

    The write and then the completion are each retried in place on transient trouble (a full disk,
    S3 or Redis unreachable) for ``ctx.store_retry_seconds``, the lease kept alive meanwhile: a
    stored chunk is counted through a Redis restart.
    """
    quality = job.definition.quality
    where = f"chunk {chunk} of job {job_id}"
    records = checked_records(ctx, job, job_id, generated, where)
    gated = judged(records)  # the live gate leaves transient failures to the repair rounds
    checks: Counter[str] = Counter()
    for record in gated:
        checks.update(record.checks or ())
    # before the write: between a stored chunk and its completion nothing but retries may run
    model_path = served_model_path(ctx)
    live_yield = yield_counters(ctx.loss_counts, job_id, job.definition, model_path, records, where=where)
    taken = write_once(ctx, job, output_key(chunk), records, where, started)
    if taken is not None:
        return taken

    def retried(step: Callable[[], bool], doing: str) -> bool:
        return retry_transient(step, f"{doing} {where}", ctx.store_retry_seconds, ctx.policy)

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
        **loop_counters(records),
        **live_yield,
    }
    ctx.leases.drop(job_id, chunk)  # completing gives the lease back: no renewal after it
    if retried(lambda: ctx.bookkeeping.complete(job_id, chunk, counters), "recording as done"):
        temperature = job.definition.spec.temperature
        record_chunk_and_judge(ctx.bookkeeping, job_id, len(gated), checks, quality, temperature)
    return DeliveryOutcome(
        Delivery.DONE, "", Cause.NONE, ok, len(records) - ok, tokens, time.monotonic() - started
    )


def _all_checks(records: list[Record]) -> Counter[str]:
    """How many records fail each check, transient failures included (the job's counters)."""
    counts: Counter[str] = Counter()
    for record in records:
        counts.update(record.checks or ())
    return counts
