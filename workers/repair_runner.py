"""Running one repair round of a stored chunk: regenerate its failed samples into a file of their own.

The chunk file is never rewritten. Round ``R`` reads the chunk's current records (the chunk file
and rounds ``1..R-1``), regenerates those that failed by a passing cause (all failed ones for
``--retry-failed``) through the worker's request pool, a multi-turn sample from its failed turn
(the answered turns before it are kept, not sent again), continues a thought cut short of the
trainer's horizon where it stopped (``continue_final_message``: only the new tokens are generated;
:mod:`dflash_tasks.core.continuation`), and writes the new records, write-once,
to ``outputs/chunk-N.repair-R.jsonl``. It holds the chunk's own lease meanwhile (the chunk is done,
so no first pass competes for it), and its counters move once per chunk and round.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future

from dflash_tasks.core.continuation import new_parts
from dflash_tasks.core.job import JobDefinition, input_key, output_key, repair_key
from dflash_tasks.core.quality import with_checks
from dflash_tasks.core.record import Part, Record, Turn, encode_records
from dflash_tasks.core.repair import RepairUnit, budget_of, to_continue, to_repair
from dflash_tasks.core.sample import Sample, decode_chunk
from dflash_tasks.core.spec_stats import spec_counts
from dflash_tasks.core.states import Cause, Delivery, JobState
from dflash_tasks.store.records import read_current
from workers.chunk_runner import ChunkContext, ChunkOutcome, collect_records, job_of_chunk
from workers.generate.conversation import start_conversation
from workers.generate.thought_opener import thought_opener
from workers.generation import Continuation
from workers.recovery.retrying import retry_transient

log = logging.getLogger(__name__)


def run_repair(ctx: ChunkContext, job_id: str, unit: RepairUnit, owner: str) -> ChunkOutcome:
    """Run repair round ``unit`` of ``job_id`` unless it is stored, running elsewhere or has nothing to do.

    Raises as :func:`~workers.chunk_runner.run_chunk` does (the lease released).
    """
    chunk = unit.chunk
    job = job_of_chunk(ctx, job_id, chunk)
    key = repair_key(chunk, unit.round)
    if job.store.exists(key):
        return ChunkOutcome(Delivery.SKIPPED, "repair round already stored", Cause.ALREADY_DONE)
    if not job.store.exists(output_key(chunk)):  # planned only for stored chunks: a hand-made message
        return ChunkOutcome(Delivery.SKIPPED, "the chunk is not stored yet: nothing to repair")
    model = job.definition.spec.model
    ctx.server.check(model)
    if not ctx.bookkeeping.acquire(job_id, chunk, owner, ctx.lease_seconds):
        return ChunkOutcome(Delivery.SKIPPED, "running elsewhere (live lease)", Cause.LEASED_ELSEWHERE)
    started = time.monotonic()
    ctx.leases.hold(job_id, chunk, owner)
    try:
        state, reason = ctx.bookkeeping.job_state(job_id)
        if job.store.exists(key) or state == JobState.PAUSED:
            ctx.bookkeeping.release(job_id, chunk, owner)
            if state == JobState.PAUSED:  # a re-run of enqueue plans it again
                return ChunkOutcome(Delivery.PAUSED, reason)
            return ChunkOutcome(Delivery.SKIPPED, "repair round already stored", Cause.ALREADY_DONE)
        earlier = tuple(r for r in range(1, unit.round) if job.store.exists(repair_key(chunk, r)))
        current = read_current(job.store, chunk, earlier)
        targets = to_repair(current, unit.permanent, unit.max_tokens, job.definition.trainer.max_length)
        if not targets:
            ctx.bookkeeping.release(job_id, chunk, owner)
            return ChunkOutcome(Delivery.SKIPPED, "nothing left to repair", Cause.ALREADY_DONE)
        samples = {s.id: s for s in decode_chunk(job.store.read(input_key(chunk)), input_key(chunk))}
        rid_prefix = f"{job_id}-{chunk}-r{unit.round}-{owner.rsplit('/', 1)[-1]}"
        futures = _start(ctx, job.definition, unit, targets, samples, rid_prefix)
        records = collect_records(futures)
        ctx.server.confirm(model)
        return _store_round(ctx, job_id, unit, targets, records, started)
    except BaseException:
        try:
            ctx.bookkeeping.release(job_id, chunk, owner)
        except Exception:  # the lease expires on its own
            log.warning("could not release the lease of chunk %s of job %s", chunk, job_id)
        raise
    finally:
        ctx.leases.drop(job_id, chunk)


def _start(
    ctx: ChunkContext,
    job: JobDefinition,
    unit: RepairUnit,
    targets: list[Record],
    samples: dict[str, Sample],
    rid_prefix: str,
) -> list[Future[Record]]:
    """Put each target's conversation into the pool: from its failed or truncated turn, or from its
    cut thought, continued up to the horizon (or the amendment's budget)."""
    spec = job.spec
    longer = spec if unit.max_tokens is None else dataclasses.replace(spec, max_tokens=unit.max_tokens)
    who = dataclasses.replace(ctx.identity, server=ctx.server.current)
    opener = thought_opener(who.server.model_path if who.server is not None else None)
    futures = []
    for old in targets:
        budget = to_continue(old, unit.max_tokens, job.trainer.max_length)
        futures.append(
            start_conversation(
                ctx.pool,
                ctx.client,
                # truncated, cut or failed at the amendment's budget: its records name that budget
                longer if old.ok or budget_of(old) == unit.max_tokens else spec,
                samples[old.id],
                who,
                ctx.policy,
                rid_prefix,
                listener=ctx.listener,
                kept=old.turns[:-1],  # the failed, truncated or cut turn is the last
                repair=unit.round,
                resume=(old.turns[-1], Continuation(opener, budget)) if budget else None,
            )
        )
    return futures


def _sent(old: Record, new: Record) -> tuple[Turn, ...]:
    """The turns ``new`` sent in this round; a continued turn as one turn per new part."""
    first = len(old.turns) - 1
    turns = list(new.turns[first:])
    if turns and turns[0] == old.turns[-1]:  # a continuation that failed: the cut turn, as it was
        return tuple(turns[1:])
    if turns and turns[0].parts and old.ok:  # continued: only the new parts were sent
        turns[:1] = [_as_turn(turns[0], part) for part in new_parts(old.turns[-1], turns[0])]
    return tuple(turns)


def _as_turn(turn: Turn, part: Part) -> Turn:
    """A continuation request's numbers as a turn of its own (for the counters)."""
    return dataclasses.replace(turn, usage=part.usage, meta_info=part.meta_info, parts=())


def _store_round(
    ctx: ChunkContext,
    job_id: str,
    unit: RepairUnit,
    old: list[Record],
    generated: list[Record],
    started: float,
) -> ChunkOutcome:
    """Check, write the round's file once, and move the counters by what changed."""
    job = ctx.jobs.get(job_id)
    quality, thinking = job.definition.quality, job.definition.spec.thinking
    records = [with_checks(r, thinking, quality) for r in generated]
    served = ctx.server.current
    model_path = served.model_path if served is not None else None
    records = ctx.loss_counts.counted(job_id, job.definition, model_path, records)
    key = repair_key(unit.chunk, unit.round)
    where = f"repair round {unit.round} of chunk {unit.chunk} of job {job_id}"
    data = encode_records(records)
    if not retry_transient(
        lambda: job.store.write_new(key, data), f"storing {where}", ctx.store_retry_seconds, ctx.policy
    ):
        log.warning("%s was stored by another worker meanwhile: keeping theirs", where)
        return ChunkOutcome(
            Delivery.SKIPPED,
            "stored meanwhile by another worker",
            Cause.ALREADY_DONE,
            seconds=time.monotonic() - started,
        )
    fixed = sum(r.ok and not o.ok for r, o in zip(records, old, strict=True))  # failed -> ok
    failed_now = sum(not r.ok for r in records)
    # Only what this round sent counts as generation: kept turns were counted with the chunk, and of
    # a continued turn only its new parts.
    sent = [_sent(o, r) for r, o in zip(records, old, strict=True)]
    spec = [spec_counts(dataclasses.replace(r, turns=turns)) for r, turns in zip(records, sent, strict=True)]
    tokens = sum(t.usage.completion_tokens for turns in sent for t in turns)
    counters = {
        "samples_ok": fixed - sum(o.ok and not r.ok for r, o in zip(records, old, strict=True)),
        "samples_failed": failed_now - sum(not o.ok for o in old),
        # as verify counts them: current records that are ok and written by a repair round
        "samples_repaired": sum(r.ok for r in records) - sum(o.ok and o.repair is not None for o in old),
        "repair_samples": len(records),
        "completion_tokens": tokens,
        "prompt_tokens": sum(t.usage.prompt_tokens for turns in sent for t in turns),
        "spec_tokens": sum(t for t, _ in spec),
        "spec_verify_ct": sum(v for _, v in spec),
        "generations": sum(len(turns) for turns in sent),
    }
    retry_transient(
        lambda: ctx.bookkeeping.complete_repair(job_id, unit.chunk, unit.round, counters) or True,
        f"recording {where} as done",
        ctx.store_retry_seconds,
        ctx.policy,
    )
    return ChunkOutcome(
        Delivery.DONE,
        f"repair round {unit.round}",
        Cause.NONE,
        len(records) - failed_now,
        failed_now,
        tokens,
        time.monotonic() - started,
    )
