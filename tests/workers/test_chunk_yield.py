"""The live yield: each stored chunk and repair round moves the job's ``yield_*`` counters by what
``report`` plans for the same records, from the counts the worker stored, tokenizing nothing.

Real Redis, a real local store and the simulator over HTTP serving a tiny tokenizer's directory
(``/model_info`` names it, so the worker counts loss tokens beside it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import GenerationSpec, JobDefinition, output_key
from dflash_tasks.core.loss_tokens import LossTokenCounter
from dflash_tasks.core.quality import with_checks
from dflash_tasks.core.record import Record, decode_records, encode_records
from dflash_tasks.core.repair import RepairUnit, Superseded
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.states import FailureKind
from dflash_tasks.core.stored_counts import RecordCounter
from dflash_tasks.core.yields import COUNTED_CHUNKS, COUNTER_PREFIX, YieldTally
from dflash_tasks.sim import SimConfig
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store.records import read_current
from tests.helpers import RedisServer
from tests.workers.chunk_support import Staged, staged_with
from tests.workers.test_repair_runner import failed_at, stage_conversations
from workers.checks.chunk_yield import yield_counters
from workers.checks.loss_counting import LossCountCache
from workers.chunk_runner import run_chunk
from workers.repair_runner import run_repair


@pytest.fixture
def counted(tmp_path: Path, redis_server: RedisServer) -> Iterator[Staged]:
    model = build_model_dir(tmp_path / "models", QWEN3_TEMPLATE, "Qwen3-8B")
    config = SimConfig(
        port=0, time_scale=0.0, mean_output_tokens=200, model=str(model), served_model_name="Qwen/Qwen3-8B"
    )
    with staged_with(tmp_path, redis_server, config) as staged:
        yield staged


def planned(job: JobDefinition, records: Sequence[Record], superseded: int = 0) -> YieldTally:
    """What ``report`` states for ``records`` (a planner of its own, the tokenizer at hand)."""
    planner = RowPlanner(job, job.trainer, ExportOptions())
    for _ in planner.rows(records):
        pass
    planner.yields.add_superseded(superseded)
    assert planner.counted
    return planner.yields


def live(staged: Staged, job_id: str) -> dict[str, float]:
    return {k: v for k, v in staged.bk.stats(job_id).items() if k.startswith(COUNTER_PREFIX)}


def definition(staged: Staged, job_id: str) -> JobDefinition:
    return staged.ctx.jobs.get(job_id).definition


def test_a_stored_chunk_adds_the_yield_report_states_for_its_records(counted: Staged) -> None:
    job_id = counted.job_id
    assert run_chunk(counted.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    records = list(decode_records(counted.store.read(output_key(0)), "chunk"))
    assert all(r.loss_counts is not None for r in records)

    stats = live(counted, job_id)
    expected = planned(definition(counted, job_id), records)
    assert stats == {**expected.counters(), COUNTED_CHUNKS: 1.0}
    assert YieldTally.from_counters(stats).to_dict() == expected.to_dict()
    assert expected.trainable > 0 and expected.generated == counted.bk.stats(job_id)["completion_tokens"]

    assert run_chunk(counted.ctx, job_id, 1, "w@h/t1/aaaaaa").status == "done"
    both = [r for c in (0, 1) for r in decode_records(counted.store.read(output_key(c)), "chunk")]
    assert (
        YieldTally.from_counters(live(counted, job_id)).to_dict()
        == planned(definition(counted, job_id), both).to_dict()
    )
    assert live(counted, job_id)[COUNTED_CHUNKS] == 2


def test_the_live_yield_tokenizes_no_row(counted: Staged, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = counted.job_id
    assert run_chunk(counted.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    records = list(decode_records(counted.store.read(output_key(0)), "chunk"))
    model_path = counted.ctx.server.current.model_path if counted.ctx.server.current else None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a row was tokenized")

    monkeypatch.setattr(LossTokenCounter, "count_many", refuse)
    job = definition(counted, job_id)
    got = yield_counters(counted.ctx.loss_counts, job_id, job, model_path, records, where="chunk 0")
    assert got == live(counted, job_id)
    # a record the worker did not count: the chunk stays out of the ratio
    bare = [dataclasses.replace(records[0], loss_counts=None), *records[1:]]
    assert yield_counters(counted.ctx.loss_counts, job_id, job, model_path, bare, where="chunk 0") == {}


SECRET = "the sample's own answer: 42"


class Unplannable(LossCountCache):
    """Fails as a planner could on a record, repeating its text."""

    def counter(self, job_id: str, job: JobDefinition, model_path: str | None) -> RecordCounter | None:
        raise ValueError(f"cannot render the row {SECRET!r}")


class Uncountable(LossCountCache):
    """Its counter fails on a record as a chat template could, repeating its text."""

    def counter(self, job_id: str, job: JobDefinition, model_path: str | None) -> RecordCounter | None:
        return FailingCounter()


class FailingCounter(RecordCounter):
    def __init__(self) -> None:  # no tokenizer: it never counts
        pass

    def counted(self, records: Sequence[Record]) -> list[Record]:
        raise ValueError(f"cannot render the row {SECRET!r}")


JOB = JobDefinition.create("sha256:x", "in.jsonl", GenerationSpec(model="m"))
#: Each count that may fail, and the logger saying so: (call with ``where``, logger, its result).
FAILING_COUNTS: dict[str, tuple[Any, str, Any]] = {
    "live yield": (
        lambda where: yield_counters(Unplannable(), JOB.job_id, JOB, "/m", [], where=where),
        "workers.checks.chunk_yield",
        {},
    ),
    "loss tokens": (
        lambda where: Uncountable().counted(JOB.job_id, JOB, "/m", [], where=where),
        "workers.checks.loss_counting",
        [],  # stored without counts
    ),
}


@pytest.mark.parametrize("what", FAILING_COUNTS)
def test_a_count_that_fails_logs_its_chunk_and_why_without_sample_text(
    caplog: pytest.LogCaptureFixture, what: str
) -> None:
    count, logger, nothing = FAILING_COUNTS[what]
    where = "repair round 2 of chunk 7 of job j1"
    with caplog.at_level(logging.WARNING, logger=logger):
        assert count(where) == nothing
    (line,) = (r.getMessage() for r in caplog.records)
    assert where in line and "ValueError: cannot render the row <" in line
    assert SECRET not in line and "42" not in line


def test_a_repair_round_moves_the_yield_by_what_report_sees_change(counted: Staged, tmp_path: Path) -> None:
    """A two-turn sample's second turn failed after it had generated (regenerated: its tokens
    superseded); the thoughts cut at max_tokens 200 are continued (their tokens carried)."""
    job_id = stage_conversations(counted, tmp_path, max_tokens=200)
    counted.ctx.jobs = type(counted.ctx.jobs)(counted.bk, counted.settings)
    job = definition(counted, job_id)
    assert run_chunk(counted.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    first = list(decode_records(counted.store.read(output_key(0)), "chunk"))
    two = next(r for r in first if len(r.turns) == 2)
    lost = dataclasses.replace(failed_at(two, 2, FailureKind.TRANSIENT).turns[1], usage=two.turns[1].usage)
    marked = dataclasses.replace(failed_at(two, 2, FailureKind.TRANSIENT), turns=(two.turns[0], lost))
    model = str(counted.ctx.server.current.model_path if counted.ctx.server.current else "")
    recounted = RecordCounter(job, model).counted([with_checks(marked, True, job.quality)])
    chunk = [recounted[0] if r.id == two.id else r for r in first]
    (counted.root / output_key(0)).write_bytes(encode_records(chunk))  # as a failure would have left it
    before = live(counted, job_id)

    outcome = run_repair(counted.ctx, job_id, RepairUnit(0, 1), "w@h/t2/bbbbbb")

    assert outcome.status == "done"
    superseded = Superseded()
    after = read_current(counted.store, 0, (1,), on_replaced=superseded)
    assert superseded.records >= 2 and superseded.tokens == two.turns[1].usage.completion_tokens > 0
    assert any(t.parts for r in after for t in r.turns)  # a continued thought among them
    expected = planned(job, after, superseded.tokens).counters(minus=planned(job, chunk))
    moved = {k: live(counted, job_id).get(k, 0.0) - before.get(k, 0.0) for k in {*before, *expected}}
    assert {k: v for k, v in moved.items() if v} == {k: v for k, v in expected.items() if v}
    # the tokens this round sent, paid for whether their records were kept or superseded
    assert moved["yield_generated_tokens"] == outcome.completion_tokens > superseded.tokens


def test_a_live_yield_that_fails_leaves_the_chunks_counters_whole(
    counted: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The yield is an optional figure: planning it must not cost the stored chunk its counters (a
    chunk written but not recorded as done is skipped as "already done" on redelivery, uncounted)."""

    def broken(self: RowPlanner, records: Any) -> Any:
        raise ValueError("planner bug")

    monkeypatch.setattr(RowPlanner, "rows", broken)
    job_id = counted.job_id
    assert run_chunk(counted.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    stats = counted.bk.stats(job_id)
    records = list(decode_records(counted.store.read(output_key(0)), "chunk"))
    assert stats["samples_ok"] == sum(r.ok for r in records) > 0
    assert counted.bk.done_count(job_id) == 1 and live(counted, job_id) == {}
