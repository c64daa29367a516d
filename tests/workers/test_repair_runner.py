"""run_repair directly: a round regenerates only the failed samples, a conversation from its failed turn.

Real Redis, a real local store and the simulator over HTTP (``GET /sim/requests`` counts what was
sent). The chunk's first pass is run by the worker itself; its records are then marked failed as a
burst of 500s would leave them (turn 2 of one conversation, turn 1 of another; one permanently).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import requests

from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition, output_key, repair_key
from dflash_tasks.core.record import Record, Turn, decode_records, encode_records
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.states import FailureKind, Outcome, RecordStatus
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store.records import read_current
from tests.workers.chunk_support import Staged
from workers.chunk_runner import run_chunk
from workers.repair_runner import run_repair


def stage_conversations(staged: Staged, tmp_path: Path, max_tokens: int = 3000) -> str:
    """A job of four two-turn conversations in one chunk; returns its id."""
    inp = tmp_path / f"convos-{uuid.uuid4().hex[:6]}.jsonl"
    rows = [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": f"first question {i}"},
                {"role": "assistant", "content": "old answer"},
                {"role": "user", "content": f"second question {i}"},
            ],
        }
        for i in range(4)
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=max_tokens, chunk_size=4)
    job = JobDefinition.create(f"sha256:{uuid.uuid4().hex}", inp.name, spec)
    staged.store.write(JOB_KEY, job.to_json())
    stage_input(inp, staged.store, job.job_id, 4)
    staged.bk.register_job(job.job_id, str(staged.root))
    return job.job_id


def failed_at(record: Record, turn: int, kind: FailureKind) -> Record:
    """``record`` as if turn ``turn`` (1-based) had failed: the turns after it never sent."""
    turns: list[Turn] = list(record.turns[: turn - 1])
    turns.append(
        Turn(
            input=record.turns[turn - 1].input,
            status=RecordStatus.FAILED,
            error="gave up after 2 attempts: HTTP 500: injected",
            failure=kind,
            attempts=2,
        )
    )
    return dataclasses.replace(
        record,
        turns=tuple(turns),
        outcome=Outcome.FAILED,
        status=RecordStatus.FAILED,
        error="turn 2 of 2: failed" if turn == 2 else "failed",
        failure=kind,
        failed_turn=turn,
        finish_reason=None,
    )


def test_a_round_regenerates_the_transient_failures_from_their_failed_turn(
    staged: Staged, tmp_path: Path
) -> None:
    job_id = stage_conversations(staged, tmp_path)
    staged.ctx.jobs = type(staged.ctx.jobs)(staged.bk, staged.settings)  # the new job's handle
    assert run_chunk(staged.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    first = list(decode_records(staged.store.read(output_key(0)), "chunk"))
    marked = [
        first[0],
        failed_at(first[1], 2, FailureKind.TRANSIENT),
        failed_at(first[2], 1, FailureKind.PERMANENT),
        failed_at(first[3], 1, FailureKind.TRANSIENT),
    ]
    chunk_file = encode_records(marked)
    (staged.root / output_key(0)).write_bytes(chunk_file)  # as the burst left it
    requests.post(f"{staged.sim.url}/sim/stats/reset", timeout=5).raise_for_status()
    sent_before = staged.sim_log()["received"]

    outcome = run_repair(staged.ctx, job_id, RepairUnit(0, 1), "w@h/t2/bbbbbb")

    assert (outcome.status, outcome.samples_ok, outcome.samples_failed) == ("done", 2, 0)
    # c1's turn 2, c3's turns 1 and 2: one request per turn regenerated, c1's turn 1 not sent again
    assert staged.sim_log()["received"] - sent_before == 3
    assert (staged.root / output_key(0)).read_bytes() == chunk_file  # never rewritten
    repaired = list(decode_records(staged.store.read(repair_key(0, 1)), "repair"))
    assert [r.id for r in repaired] == ["c1", "c3"]
    assert all(r.ok and r.repair == 1 and r.failure is None and len(r.turns) == 2 for r in repaired)
    assert repaired[0].turns[0] == marked[1].turns[0]  # the answered turn is kept as it was
    current = read_current(staged.store, 0, (1,))
    assert [(r.id, r.ok) for r in current] == [("c0", True), ("c1", True), ("c2", False), ("c3", True)]
    assert staged.bk.stats(job_id)["samples_repaired"] == 2 and staged.bk.live_leases(job_id) == {}

    again = run_repair(staged.ctx, job_id, RepairUnit(0, 1), "w@h/t3/cccccc")  # a redelivery
    assert (again.status, again.reason) == ("skipped", "repair round already stored")
    idle = run_repair(staged.ctx, job_id, RepairUnit(0, 2), "w@h/t4/dddddd")  # only c2 is left: permanent
    assert (idle.status, idle.reason) == ("skipped", "nothing left to repair")
    retried = run_repair(staged.ctx, job_id, RepairUnit(0, 2, permanent=True), "w@h/t5/eeeeee")
    assert (retried.status, retried.samples_ok) == ("done", 1)
    assert [r.ok for r in read_current(staged.store, 0, (1, 2))] == [True] * 4
    assert staged.bk.stats(job_id)["samples_repaired"] == 3  # once per chunk and round


def test_a_round_continues_a_cut_first_turn_and_then_sends_the_turns_after_it(
    staged: Staged, tmp_path: Path
) -> None:
    job_id = stage_conversations(staged, tmp_path, max_tokens=100)  # most first thoughts are cut
    staged.ctx.jobs = type(staged.ctx.jobs)(staged.bk, staged.settings)
    assert run_chunk(staged.ctx, job_id, 0, "w@h/t1/aaaaaa").status == "done"
    first = list(decode_records(staged.store.read(output_key(0)), "chunk"))
    cut = [r for r in first if len(r.turns) == 1 and r.finish_reason == "length" and not r.turns[0].content]
    assert cut, [(len(r.turns), r.finish_reason) for r in first]
    tokens_before = int(staged.bk.stats(job_id)["completion_tokens"])

    outcome = run_repair(staged.ctx, job_id, RepairUnit(0, 1), "w@h/t2/bbbbbb")

    assert outcome.status == "done"
    repaired = {r.id: r for r in decode_records(staged.store.read(repair_key(0, 1)), "repair")}
    new_tokens = 0
    for old in cut:
        new = repaired[old.id]
        continued = new.turns[0]
        assert continued.finish_reason == "stop" and continued.content, continued
        assert continued.reasoning.startswith(old.turns[0].reasoning) and len(continued.parts) == 2
        assert continued.parts[0].usage == old.turns[0].usage  # the cut part, kept as it was
        assert len(new.turns) == 2  # the second turn, which the cut had stopped, was sent
        new_tokens += continued.parts[1].usage.completion_tokens + new.turns[1].usage.completion_tokens
    # the counters move by the new tokens only: the cut part was counted with the chunk
    moved = int(staged.bk.stats(job_id)["completion_tokens"]) - tokens_before
    assert moved == outcome.completion_tokens == new_tokens
