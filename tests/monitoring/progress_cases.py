"""Snapshots that exercise every section of the progress document (the golden documents in
``golden/progress_<name>.json`` are what ``progress.json`` held for each, byte for byte)."""

from __future__ import annotations

import json
from typing import Any

from dflash_tasks.coord.progress_keys import BUCKET_SECONDS, window_bounds
from dflash_tasks.monitoring.snapshot import Snapshot

NOW = 1_764_000_000.0
HOUR = 3600.0

TUNER = {
    "target": 72,
    "phase": "climbing",
    "reason": "throughput rising",
    "floor": 8,
    "ceiling": 256,
    "curve": [
        {"target": 48, "tokens_per_s": 27000.0, "accept_length": 3.125, "token_usage": 0.41, "windows": 2},
        {"target": 72, "tokens_per_s": 31000.5, "accept_length": 3.0, "token_usage": 0.6, "windows": 1},
    ],
    "window_seconds": 30.0,
    "completed_tokens": 123456,
}


def _buckets(worker: str, multi_turn: bool = False) -> dict[int, dict[str, float]]:
    start, end = window_bounds(NOW)
    row = {
        "samples": 5.6 * BUCKET_SECONDS,
        "tokens": 15_900.0 * BUCKET_SECONDS,
        "spec_tokens": 900.0,
        "verify": 300.0,
        f"{worker}|samples": 2.0 * BUCKET_SECONDS,
        f"{worker}|tokens": 5_000.0 * BUCKET_SECONDS,
        f"{worker}|spec_tokens": 450.0,
        f"{worker}|verify": 150.0,
    }
    if multi_turn:
        row["turns"] = 11.2 * BUCKET_SECONDS
    return {b: dict(row) for b in range(start, end, BUCKET_SECONDS)}


def _beat(endpoint: str, tuner: str = "", seen: float = 1.0) -> dict[str, str]:
    return {
        "last_seen": str(NOW - seen),
        "beat_s": "2",
        "endpoint": endpoint,
        "healthy": "1",
        "inflight": "40",
        "waiting": "3",
        "max_inflight": "72",
        "held_chunks": "2",
        "server_accept_length": "2.875",
        "tuner": tuner,
    }


def running() -> Snapshot:
    """A running job on two live workers (one tuned) and a gone one, priced, with every section."""
    per = {
        "gpu0@h": {
            "samples": 500.0,
            "failed": 2.0,
            "tokens": 1e6,
            "chunks": 5.0,
            "first": NOW - HOUR,
            "spec_tokens": 3000.0,
            "verify": 1000.0,
        },
        "gpu1@h": {"samples": 400.0, "tokens": 8e5, "chunks": 4.0, "first": NOW - HOUR},
        "gpu2@h": {"samples": 10.0, "first": NOW - 2 * HOUR},
    }
    beats = {
        "gpu0@h": _beat("http://e0", json.dumps(TUNER, separators=(",", ":"))),
        "gpu1@h": _beat("http://e1", "not json"),
    }
    return Snapshot(
        job_id="j1",
        output="/out",
        model="m",
        total_samples=10_000,
        total_chunks=100,
        invalid_lines=3,
        done_chunks=9,
        done_samples=900,
        running_chunks=4,
        queue="dflash.m",
        queue_depth=80,
        job={
            "started_at": str(NOW - HOUR),
            "gpu_tick": str(NOW - 10),
            "gpu_seconds": "7200",
            "state": "running",
        },
        stats={
            "samples_ok": 880.0,
            "samples_failed": 5.0,
            "samples_repaired": 2.0,
            "completion_tokens": 1_800_000.0,
            "prompt_tokens": 90_000.0,
            "generations": 900.0,
            "spec_tokens": 3000.0,
            "spec_verify_ct": 1000.0,
            "requeued": 3.0,
            "repairs": 1.0,
            "yield_counted_chunks": 9.0,
            "yield_generated_tokens": 1_800_000.0,
            "yield_trainable_tokens": 1_500_000.0,
            "yield_dropped_too_long": 20.0,
        },
        per_worker=per,
        workers=beats,
        buckets=_buckets("gpu0@h"),
        gpu_hour_usd=2.5,
        trainable={
            "source": "export",
            "written_at": "2026-12-01T00:00:00Z",
            "counted_samples": 800,
            "total_loss_tokens": 1_200_000,
            "mean_per_sample": 1500.0,
            "samples_in_job": 10_000,
            "projected_total_loss_tokens": 15_000_000,
            "max_length": 4096,
            "extra": "not shown",
        },
        staged_sources=[
            {"name": "a.jsonl", "samples": 6000, "invalid": 1},
            {"name": "b.jsonl", "samples": 4000, "invalid": 2},
        ],
        source_quality={"a.jsonl": {"ok": 500, "failed": 3, "truncated_share": 0.01, "cost_share": 0.6}},
    )


def multi_turn_paused() -> Snapshot:
    """A paused multi-turn job, no price, per-worker accept lengths from the server only."""
    per = {"gpu0@h": {"samples": 100.0, "tokens": 1e5, "first": NOW - 600}}
    return Snapshot(
        job_id="j2",
        output="s3://bucket/out",
        model="m2",
        total_samples=500,
        total_chunks=5,
        invalid_lines=0,
        done_chunks=1,
        done_samples=100,
        total_turns=1500,
        done_turns=300,
        job={"started_at": str(NOW - 600), "state": "paused", "pause_reason": "budget spent"},
        stats={"samples_ok": 100.0, "completion_tokens": 100_000.0, "generations": 300.0, "turns": 300.0},
        per_worker=per,
        workers={"gpu0@h": _beat("http://[::1]:30000")},
        buckets=_buckets("gpu0@h", multi_turn=True),
    )


def redis_down() -> Snapshot:
    """Redis unreachable: the store's counts, a carried-over note."""
    return Snapshot(
        job_id="j3",
        output="/out3",
        model="m",
        total_samples=1000,
        total_chunks=10,
        invalid_lines=0,
        done_chunks=3,
        done_samples=300,
        redis_ok=False,
        notes=("counts other than done chunks are from progress.json of 2026-12-01T00:00:00Z",),
        job={"started_at": str(NOW - 100)},
        stats={"samples_ok": 200.0, "completion_tokens": 20_000.0},
    )


def done_settled() -> Snapshot:
    """A finished job whose figures are final."""
    return Snapshot(
        job_id="j4",
        output="/out4",
        model="m",
        total_samples=100,
        total_chunks=1,
        invalid_lines=0,
        done_chunks=1,
        done_samples=100,
        settled=True,
        job={
            "started_at": str(NOW - 500),
            "finished_at": str(NOW - 100),
            "gpu_seconds": "400",
            "state": "done",
        },
        stats={"samples_ok": 99.0, "samples_failed": 1.0, "completion_tokens": 10_000.0},
        gpu_hour_usd=3.0,
    )


def empty() -> Snapshot:
    """A job nobody has started: no Redis figures at all."""
    return Snapshot(
        job_id="j5",
        output="/o",
        model="m",
        total_samples=0,
        total_chunks=0,
        invalid_lines=0,
        done_chunks=0,
        done_samples=0,
    )


CASES: dict[str, Any] = {
    "running": running,
    "multi_turn_paused": multi_turn_paused,
    "redis_down": redis_down,
    "done_settled": done_settled,
    "empty": empty,
}
