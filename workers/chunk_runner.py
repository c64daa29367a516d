"""Running one chunk: the plain function behind the Celery task (testable without a broker)."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.jobs_cache import JobCache, JobHandle, UnknownChunk
from dflash_tasks.core.job import input_key, output_key
from dflash_tasks.core.quality import check_record
from dflash_tasks.core.sample import decode_chunk
from dflash_tasks.monitoring import metrics
from workers.flow.request_pool import RequestPool
from workers.generation import RetryPolicy, WorkerIdentity, generate_sample
from workers.live_gate import record_chunk_and_judge
from workers.recovery.leases import LeaseKeeper
from workers.sglang_client import SGLangClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What happened to a chunk delivery."""

    status: str  # "done" | "skipped"
    reason: str = ""
    samples_ok: int = 0
    samples_failed: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
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


def run_chunk(ctx: ChunkContext, job_id: str, chunk: int, owner: str) -> ChunkOutcome:
    """Generate and store ``chunk`` of ``job_id`` unless it is done or running elsewhere.

    Raises :class:`ServerUnavailable` (nothing stored, lease released) when the server dies, and
    :class:`UnknownChunk` for a chunk number outside the job.
    """
    job = ctx.jobs.get(job_id)
    if not 0 <= chunk < job.manifest.chunks:  # retrying a chunk that does not exist never ends
        raise UnknownChunk(f"job {job_id} has no chunk {chunk} (it has {job.manifest.chunks})")
    out_key = output_key(chunk)
    if job.store.exists(out_key):
        return ChunkOutcome("skipped", "already done")
    if not ctx.bookkeeping.acquire(job_id, chunk, owner, ctx.lease_seconds):
        return ChunkOutcome("skipped", "running elsewhere (live lease)")
    started = time.monotonic()
    ctx.leases.hold(job_id, chunk, owner)
    metrics.chunk_started(job_id)
    try:
        if job.store.exists(out_key):  # finished by another worker between the check and the lease
            ctx.bookkeeping.release(job_id, chunk, owner)
            return ChunkOutcome("skipped", "already done")
        samples = decode_chunk(job.store.read(input_key(chunk)))
        spec = job.definition.spec
        rid_prefix = f"{job_id}-{chunk}-{owner.rsplit('/', 1)[-1]}"
        futures = [
            ctx.pool.submit(generate_sample, ctx.client, spec, s, ctx.identity, ctx.policy, rid_prefix)
            for s in samples
        ]
        for fut in futures:
            fut.add_done_callback(metrics.on_sample_future(job_id))
        records = _collect(futures)
        outcome = _store_chunk(ctx, job, job_id, chunk, records, started)
        if outcome.status == "done":
            metrics.chunk_stored(job_id, outcome.seconds)
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
    ctx: ChunkContext, job: JobHandle, job_id: str, chunk: int, records: list[dict[str, Any]], started: float
) -> ChunkOutcome:
    """Check each record, write the chunk atomically, count it once, and feed the live gate."""
    quality = job.definition.quality
    checks: Counter[str] = Counter()
    for record in records:
        record["checks"] = check_record(record, job.definition.spec.thinking, quality)
        checks.update(record["checks"])
    data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)
    if not job.store.write_new(output_key(chunk), data):
        # Stored meanwhile by another worker: this one ran past its lease (frozen, or cut off from
        # Redis) and the chunk was taken over. A stored chunk never changes: keep that one.
        log.warning(
            "chunk %s of job %s was stored by another worker meanwhile: keeping theirs", chunk, job_id
        )
        return ChunkOutcome(
            "skipped", "stored meanwhile by another worker", seconds=time.monotonic() - started
        )
    ok = sum(1 for r in records if r["status"] == "ok")
    tokens = sum(int(r["usage"]["completion_tokens"]) for r in records)
    counters = {
        "samples_ok": ok,
        "samples_failed": len(records) - ok,
        "completion_tokens": tokens,
        "prompt_tokens": sum(int(r["usage"]["prompt_tokens"]) for r in records),
        "chunk_seconds": time.monotonic() - started,
        **{f"check_{name}": n for name, n in checks.items()},
    }
    if ctx.bookkeeping.complete(job_id, chunk, counters):
        record_chunk_and_judge(ctx.bookkeeping, job_id, len(records), checks, quality)
    return ChunkOutcome("done", "", ok, len(records) - ok, tokens, time.monotonic() - started)


def _collect(futures: list[Future[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Results in input order; on any failure, cancel what has not started and re-raise.

    A chunk that will not be stored must not keep the shared request pool busy.
    """
    records: list[dict[str, Any]] = []
    try:
        for fut in futures:
            records.append(fut.result())
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return records
