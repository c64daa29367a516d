"""The preflight's projections count generations: a three-turn conversation costs three requests."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.job import output_key
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.producer.preflight import judge, wait_for_leases
from dflash_tasks.store import LocalStore


def turn(latency: float, tokens: int = 500) -> dict[str, object]:
    usage = {"prompt_tokens": 10, "completion_tokens": tokens, "reasoning_tokens": tokens - 50}
    return {"status": "ok", "latency_s": latency, "usage": usage, "finish_reason": "stop"}


def test_projections_are_per_turn_and_cover_the_turns_left(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    records = [
        {"id": "one", "status": "ok", "user_turns": 1, "turns": [turn(2.0)], "checks": []},
        {
            "id": "three",
            "status": "ok",
            "user_turns": 3,
            "turns": [turn(2.0), turn(4.0), turn(6.0)],
            "checks": [],
        },
    ]
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    report = judge(
        store,
        [0],
        QualitySettings(),
        10.0,
        slots=8,
        workers=2,
        remaining=1000,
        gpu_hour_usd=3.6,
        remaining_samples=500,
    )
    assert (report.samples, report.turns, report.multi_turn) == (2, 4, 1)
    assert report.mean_latency == 3.5 and report.output_tokens == [500] * 4  # per turn, not per sample
    doc = report.to_dict()
    assert doc["projected_turns_per_s"] == round(8 / 3.5, 3)
    assert doc["projected_eta_s"] == round(1000 / (8 / 3.5))  # the turns left, at the turn rate
    assert doc["projected_cost_usd"] == round(1000 / (8 / 3.5) / 3600 * 2 * 3.6, 2)
    text = report.render()
    assert "preflight: 2 samples (4 turns generated, 1 multi-turn conversations)" in text
    assert "2.29 turns/s with 2 workers x 4 in flight, ETA" in text
    assert "for 1,000 turns (500 samples)" in text
    assert doc["tuned_workers"] == 0
    some = replace(report, tuned_workers=1).render()
    assert "2 workers x 4 in flight (1 of them tuning it from there), ETA" in some
    assert "2 workers x 4 in flight (tuning it from there), ETA" in replace(report, tuned_workers=2).render()


def test_a_failed_preflight_waits_for_its_running_chunks_before_deleting(
    rclient: redis.Redis, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = Bookkeeping(rclient, prefix)
    bk.acquire("j", 3, "w@h/t/1", 60)  # a worker still generates preflight chunk 3
    bk.acquire("j", 9, "w@h/t/2", 60)  # not a preflight chunk: not waited for
    releaser = threading.Timer(0.6, lambda: bk.release("j", 3, "w@h/t/1"))
    releaser.start()
    started = time.monotonic()
    assert wait_for_leases(bk, "j", [1, 3, 5], timeout=10, poll=0.05)
    assert 0.5 < time.monotonic() - started < 5
    assert "waiting for 1 preflight chunk(s) still being generated" in capsys.readouterr().err
    assert wait_for_leases(bk, "j", [1, 3, 5], timeout=10)  # nothing running: no wait, no message
    assert capsys.readouterr().err == ""
    bk.acquire("j", 5, "w@h/t/3", 60)
    assert not wait_for_leases(bk, "j", [5], timeout=0.2, poll=0.05)
    assert "gave up waiting for chunks [5]" in capsys.readouterr().err
