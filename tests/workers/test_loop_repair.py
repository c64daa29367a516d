"""A repair round and a sample stopped in a loop: under ``regenerate`` it is sent again from its
looped turn with the round's number as sampling seed; under ``drop`` it is left alone.

Real Redis, a real local store and the simulator over HTTP. The chunk's first pass is run by the
worker; a record is then given a looped last turn by hand, as the streaming worker writes one.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import requests

from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition, output_key, repair_key
from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.record import Record, decode_records, encode_records, outcome_of
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.repetition import FINISH_REASON, Loop
from dflash_tasks.producer.staging import stage_input
from tests.workers.chunk_support import Staged
from workers.chunk_runner import ChunkWork, run_chunk
from workers.repair_runner import run_repair


def stage(staged: Staged, tmp_path: Path, on_loop: OnLoop, chunks: int = 1) -> str:
    """A job of four two-turn conversations a chunk, with ``on_loop``, its chunk 0 generated;
    returns its id."""
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
        for i in range(4 * chunks)
    ]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=3000, chunk_size=4)
    quality = QualitySettings(on_loop=on_loop)
    job = JobDefinition.create(f"sha256:{uuid.uuid4().hex}", inp.name, spec, quality)
    staged.store.write(JOB_KEY, job.to_json())
    stage_input(inp, staged.store, job.job_id, 4 * chunks)
    staged.bk.register_job(job.job_id, str(staged.root))
    staged.ctx.jobs = type(staged.ctx.jobs)(staged.bk, staged.settings)  # the new job's handle
    assert run_chunk(staged.ctx, job.job_id, 0, "w@h/t1/aaaaaa").status == "done"
    return job.job_id


def looped_second_turn(record: Record) -> Record:
    """``record`` as if its second turn had been stopped in a loop."""
    second = record.turns[1]
    loop = Loop(start_char=0, start_token=0, period_chars=4, copies=9.0, detected_char=40, detected_token=10)
    turn = dataclasses.replace(second, finish_reason=FINISH_REASON, content="", loop=loop)
    turns = (record.turns[0], turn)
    return dataclasses.replace(record, turns=turns, outcome=outcome_of(turns, 2), finish_reason=FINISH_REASON)


def mark_c1_looped(staged: Staged) -> list[Record]:
    first = list(decode_records(staged.store.read(output_key(0)), "chunk"))
    marked = [first[0], looped_second_turn(first[1]), *first[2:]]
    (staged.root / output_key(0)).write_bytes(encode_records(marked))
    requests.post(f"{staged.sim.url}/sim/stats/reset", timeout=5).raise_for_status()
    return marked


def test_regenerate_sends_the_looped_turn_again_with_the_rounds_seed(staged: Staged, tmp_path: Path) -> None:
    job_id = stage(staged, tmp_path, OnLoop())
    marked = mark_c1_looped(staged)
    sent_before = staged.sim_log()["received"]

    outcome = run_repair(staged.ctx, job_id, RepairUnit(0, 1), "w@h/t2/bbbbbb")

    assert outcome.status == "done"
    assert staged.sim_log()["received"] - sent_before == 1  # turn 2 of c1, turn 1 kept
    (repaired,) = decode_records(staged.store.read(repair_key(0, 1)), "repair")
    assert repaired.id == "c1" and repaired.turns[0] == marked[1].turns[0]
    assert not repaired.turns[1].looped and (repaired.sampling or {}).get("seed") == 1


def test_drop_leaves_a_looped_sample_alone(staged: Staged, tmp_path: Path) -> None:
    job_id = stage(staged, tmp_path, OnLoop("drop"))
    mark_c1_looped(staged)
    outcome = run_repair(staged.ctx, job_id, RepairUnit(0, 1), "w@h/t2/bbbbbb")
    assert (outcome.status, outcome.reason) == ("skipped", "nothing left to repair")


def test_a_stored_chunk_counts_its_loops_and_the_budget_their_stops_saved(
    staged: Staged, tmp_path: Path
) -> None:
    job_id = stage(staged, tmp_path, OnLoop(), chunks=2)
    assert "looped_generations" not in staged.bk.stats(job_id)  # chunk 0 looped nowhere
    records = mark_c1_looped(staged)  # chunk 1's records, as its first pass returns them
    second = records[1].turns[1]
    job = staged.ctx.jobs.get(job_id)
    outcome = ChunkWork(job_id, 1).store(staged.ctx, job, records, time.monotonic())
    assert outcome.status == "done"
    stats = staged.bk.stats(job_id)
    assert stats["looped_generations"] == 1 and stats["check_looping"] == 1
    assert stats["loop_tokens_saved"] == 3000 - second.usage.completion_tokens
