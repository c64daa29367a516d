"""The looping gate, live and in the preflight: a job where over 10% of samples loop stops, with a
message that names greedy decoding when the job samples at temperature 0. Real Redis; records of
looped turns written by hand in the store's format."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.job import GenerationSpec, JobDefinition, output_key
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.states import JobState
from dflash_tasks.producer.preflight import judge
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer
from workers.checks.live_gate import record_chunk_and_judge

CAUSES = [(0.0, "greedy decoding loops"), (0.6, "presence_penalty")]


@pytest.mark.parametrize(("temperature", "cause"), CAUSES)
def test_the_live_gate_pauses_a_looping_job_naming_the_likely_cause(
    redis_server: RedisServer, temperature: float, cause: str
) -> None:
    bk = Bookkeeping.from_url(redis_server.url, f"t{uuid.uuid4().hex[:8]}")
    job_id = "j-loops"
    bk.register_job(job_id, "/tmp/out")
    settings = QualitySettings(min_samples=100)
    assert record_chunk_and_judge(bk, job_id, 100, {"looping": 10}, settings, temperature) == []
    assert bk.job_state(job_id)[0] is JobState.RUNNING  # 10 of 100: at the limit, not over it
    (failure,) = record_chunk_and_judge(bk, job_id, 100, {"looping": 30}, settings, temperature)
    state, reason = bk.job_state(job_id)
    assert failure.check == "looping" and state is JobState.PAUSED
    assert "20% of samples fall into a loop" in reason and cause in reason


def looped_line(i: int) -> dict[str, object]:
    loop = {"start_char": 0, "start_token": 0, "period_chars": 40, "copies": 40.0}
    loop |= {"detected_char": 1600, "detected_token": 400, "text": "reasoning"}
    usage = {"prompt_tokens": 10, "completion_tokens": 400, "reasoning_tokens": 400}
    turn = {"status": "ok", "usage": usage, "finish_reason": "repetition", "loop": loop, "reasoning": "x"}
    return {"id": f"s{i}", "status": "ok", "outcome": "truncated", "turns": [turn], "checks": ["looping"]}


def ok_line(i: int) -> dict[str, object]:
    usage = {"prompt_tokens": 10, "completion_tokens": 500, "reasoning_tokens": 450}
    turn = {"status": "ok", "usage": usage, "finish_reason": "stop", "reasoning": "r", "content": "c"}
    return {"id": f"s{i}", "status": "ok", "turns": [turn], "checks": []}


@pytest.mark.parametrize(("looping", "gated"), [(2, True), (1, False)])
def test_the_preflight_gate_stops_a_job_at_temperature_zero_that_loops(
    tmp_path: Path, looping: int, gated: bool
) -> None:
    store = LocalStore(tmp_path)
    lines = [looped_line(i) for i in range(looping)] + [ok_line(i) for i in range(looping, 10)]
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in lines))
    job = JobDefinition.create("sha256:x", "p.jsonl", GenerationSpec("m", temperature=0.0))
    report = judge(
        store, [0], job.quality, 10.0, slots=4, workers=1, remaining=100, gpu_hour_usd=0.0, job=job
    )
    assert [f.check for f in report.failures] == (["looping"] if gated else [])
    if gated:
        assert "raise --temperature" in report.failures[0].message
