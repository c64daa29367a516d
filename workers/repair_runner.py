"""Running one repair round of a stored chunk: regenerate its failed samples into a file of their own.

The chunk file is never rewritten. Round ``R`` reads the chunk's current records (the chunk file
and rounds ``1..R-1``), regenerates those that failed by a passing cause (all failed ones for
``--retry-failed``) through the worker's request pool, a multi-turn sample from its failed turn
(the answered turns before it are kept, not sent again), continues a thought cut short of the
trainer's horizon where it stopped (``continue_final_message``: only the new tokens are generated;
:mod:`dflash_tasks.core.continuation`), sends a sample stopped in a loop again from its looped turn
when the job's ``--on-loop`` says so, with the round's number as sampling seed (another draw than
the looped one; at temperature 0 it changes nothing), and writes the new records, write-once,
to ``outputs/chunk-N.repair-R.jsonl``. It holds the chunk's own lease meanwhile (the chunk is done,
so no first pass competes for it), and its counters move once per chunk and round. The lease and
the listeners' events are the leased-work runner's (:func:`workers.leased_work.run_leased`), as
a chunk's are: a regenerated sample reaches Prometheus, the live rates and the in-flight tuner with
what this round sent (:func:`round_counts`).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from dflash_tasks.coord.jobs_cache import JobHandle
from dflash_tasks.core.continuation import new_parts
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.job import JobDefinition, input_key, output_key, repair_key
from dflash_tasks.core.on_loop import loop_counters
from dflash_tasks.core.record import Part, Record, Turn
from dflash_tasks.core.repair import RepairUnit, budget_of, to_continue, to_repair
from dflash_tasks.core.sample import Sample, decode_chunk
from dflash_tasks.core.spec_stats import SampleCounts, retractions, spec_counts
from dflash_tasks.core.states import Cause, Delivery
from dflash_tasks.store.records import read_current
from workers.checks.chunk_yield import yield_counters
from workers.generate.conversation import start_conversation
from workers.generate.request_budget import request_budget
from workers.generate.thought_opener import thought_opener
from workers.generation import Continuation
from workers.leased_work import ChunkContext, checked_records, run_leased, served_model_path, write_once
from workers.recovery.retrying import retry_transient


def run_repair(ctx: ChunkContext, job_id: str, unit: RepairUnit, owner: str) -> DeliveryOutcome:
    """Run repair round ``unit`` of ``job_id`` unless it is stored, running elsewhere or has nothing
    to do (raises as :func:`~workers.leased_work.run_leased` does)."""
    return run_leased(ctx, RepairWork(job_id, unit), owner)


@dataclass(slots=True)
class RepairWork:
    """A repair round of a stored chunk (a :class:`~workers.leased_work.LeasedWork`)."""

    job_id: str
    unit: RepairUnit
    targets: list[Record] = field(default_factory=list)  # the records it regenerates, read by start

    @property
    def chunk(self) -> int:
        return self.unit.chunk

    @property
    def rid_stem(self) -> str:
        return f"{self.job_id}-{self.unit.chunk}-r{self.unit.round}"

    def needless(self, job: JobHandle) -> DeliveryOutcome | None:
        if job.store.exists(repair_key(self.unit.chunk, self.unit.round)):
            return DeliveryOutcome(Delivery.SKIPPED, "repair round already stored", Cause.ALREADY_DONE)
        if not job.store.exists(output_key(self.unit.chunk)):  # planned only for stored chunks
            return DeliveryOutcome(Delivery.SKIPPED, "the chunk is not stored yet: nothing to repair")
        return None

    def start(
        self, ctx: ChunkContext, job: JobHandle, rid_prefix: str
    ) -> list[Future[Record]] | DeliveryOutcome:
        """Read the chunk's current records and start those this round regenerates."""
        unit, chunk = self.unit, self.unit.chunk
        earlier = tuple(r for r in range(1, unit.round) if job.store.exists(repair_key(chunk, r)))
        current = read_current(job.store, chunk, earlier)
        job_def = job.definition
        self.targets = to_repair(
            current, unit.permanent, unit.max_tokens, job_def.trainer.max_length, job_def.quality.on_loop
        )
        if not self.targets:
            return DeliveryOutcome(Delivery.SKIPPED, "nothing left to repair", Cause.ALREADY_DONE)
        samples = {s.id: s for s in decode_chunk(job.store.read(input_key(chunk)), input_key(chunk))}
        return _start(ctx, job.definition, unit, self.targets, samples, rid_prefix)

    def counts(self, index: int, record: Record) -> SampleCounts:
        return round_counts(self.targets[index], record)

    def store(
        self, ctx: ChunkContext, job: JobHandle, records: list[Record], started: float
    ) -> DeliveryOutcome:
        return _store_round(ctx, job, self.job_id, self.unit, self.targets, records, started)


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
    horizon = request_budget(ctx.loss_counts, job.job_id, job, who.server)
    futures = []
    for old in targets:
        budget = to_continue(old, unit.max_tokens, job.trainer.max_length)
        # truncated, cut or failed at the amendment's budget: its records name that budget
        chosen = longer if old.ok or budget_of(old) == unit.max_tokens else spec
        if old.turns[-1].looped:  # another draw than the one that looped
            chosen = dataclasses.replace(chosen, seed=unit.round)
        futures.append(
            start_conversation(
                ctx.pool,
                ctx.client,
                chosen,
                samples[old.id],
                who,
                ctx.policy,
                rid_prefix,
                listener=ctx.listener,
                kept=old.turns[:-1],  # the failed, truncated or cut turn is the last
                repair=unit.round,
                resume=(old.turns[-1], Continuation(opener, budget)) if budget else None,
                budget=horizon,
                repetition=job.quality.repetition,
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


def round_counts(old: Record, new: Record) -> SampleCounts:
    """What a regenerated sample adds to the counters: only what this round sent (:func:`_sent`).

    Its turns were settled with the chunk (``turns`` 0: the job's progress moves by none).
    """
    sent = _sent(old, new)
    spec_tokens, verify = spec_counts(dataclasses.replace(new, turns=sent))
    return SampleCounts(
        ok=new.ok,
        completion_tokens=sum(t.usage.completion_tokens for t in sent),
        prompt_tokens=sum(t.usage.prompt_tokens for t in sent),
        spec_tokens=spec_tokens,
        verify=verify,
        turns=0,
        generations=len(sent),
        retractions=retractions(sent),
    )


def _store_round(
    ctx: ChunkContext,
    job: JobHandle,
    job_id: str,
    unit: RepairUnit,
    old: list[Record],
    generated: list[Record],
    started: float,
) -> DeliveryOutcome:
    """Check, write the round's file once, and move the counters by what changed."""
    where = f"repair round {unit.round} of chunk {unit.chunk} of job {job_id}"
    records = checked_records(ctx, job, job_id, generated, where)
    # before the write: between a stored round and its completion nothing but retries may run
    model_path = served_model_path(ctx)
    live_yield = yield_counters(
        ctx.loss_counts, job_id, job.definition, model_path, records, old, where=where
    )
    taken = write_once(ctx, job, repair_key(unit.chunk, unit.round), records, where, started)
    if taken is not None:
        return taken
    fixed = sum(r.ok and not o.ok for r, o in zip(records, old, strict=True))  # failed -> ok
    failed_now = sum(not r.ok for r in records)
    # Only what this round sent counts as generation: kept turns were counted with the chunk, and of
    # a continued turn only its new parts.
    each = [round_counts(o, r) for r, o in zip(records, old, strict=True)]
    tokens = sum(c.completion_tokens for c in each)
    counters = {
        "samples_ok": fixed - sum(o.ok and not r.ok for r, o in zip(records, old, strict=True)),
        "samples_failed": failed_now - sum(not o.ok for o in old),
        # as verify counts them: current records that are ok and written by a repair round
        "samples_repaired": sum(r.ok for r in records) - sum(o.ok and o.repair is not None for o in old),
        "repair_samples": len(records),
        "completion_tokens": tokens,
        "prompt_tokens": sum(c.prompt_tokens for c in each),
        "spec_tokens": sum(c.spec_tokens for c in each),
        "spec_verify_ct": sum(c.verify for c in each),
        "generations": sum(c.generations for c in each),
        **loop_counters(records),  # a looped last turn is one this round sent
        **live_yield,
    }
    ctx.leases.drop(job_id, unit.chunk)  # completing gives the lease back: no renewal after it
    retry_transient(
        lambda: ctx.bookkeeping.complete_repair(job_id, unit.chunk, unit.round, counters) or True,
        f"recording {where} as done",
        ctx.store_retry_seconds,
        ctx.policy,
    )
    return DeliveryOutcome(
        Delivery.DONE,
        f"repair round {unit.round}",
        Cause.NONE,
        len(records) - failed_now,
        failed_now,
        tokens,
        time.monotonic() - started,
    )
