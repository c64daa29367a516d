"""The progress math (pure) and its Redis data path (in-process, against a private Redis)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.progress_keys import BUCKET_SECONDS, PROGRESS_KEY, window_bounds
from dflash_tasks.core.errors import RetryableError, SampleRejected
from dflash_tasks.core.job import GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.states import ErrorKind
from dflash_tasks.monitoring import metrics
from dflash_tasks.monitoring.progress import (
    GPU_GAP_CAP,
    compute_document,
    cost,
    eta_seconds,
    gpu_seconds,
    progress_document,
    window_rate,
)
from dflash_tasks.monitoring.progress_writer import FINAL_AFTER, ProgressWriter, registered_jobs
from dflash_tasks.monitoring.snapshot import Snapshot
from dflash_tasks.monitoring.status import render
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer, free_port
from workers.monitor.live_stats import WorkerStats
from workers.sglang_client import ChatRequest, SGLangClient, parse_completion

NOW = 1_764_000_000.0  # a multiple of the bucket width, so the window is easy to reason about
HOUR = 3600.0


def steady_buckets(
    now: float, samples_s: float, tokens_s: float, worker: str = ""
) -> dict[int, dict[str, float]]:
    """A full window of buckets at a constant rate."""
    start, end = window_bounds(now)
    row = {"samples": samples_s * BUCKET_SECONDS, "tokens": tokens_s * BUCKET_SECONDS}
    if worker:
        row |= {f"{worker}|samples": row["samples"], f"{worker}|tokens": row["tokens"]}
    return {b: dict(row) for b in range(start, end, BUCKET_SECONDS)}


def live_workers(n: int, now: float) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    names = [f"gpu{i}@h" for i in range(n)]
    per = {w: {"samples": 10.0, "first": now - HOUR} for w in names}
    beats = {
        w: {"last_seen": str(now - 1), "beat_s": "2", "endpoint": f"http://e{i}", "healthy": "1"}
        for i, w in enumerate(names)
    }
    return per, beats


def snapshot(**changes: Any) -> Snapshot:
    base: dict[str, Any] = dict(
        job_id="j1",
        output="/out",
        model="m",
        total_samples=1000,
        total_chunks=10,
        invalid_lines=0,
        done_chunks=0,
        done_samples=0,
    )
    base.update(changes)
    return Snapshot(**base)


# --- the seed's numbers -------------------------------------------------------------------------


def test_seed_numbers_eta_from_the_sample_rate_and_cost() -> None:
    """913,786 samples at 5.6 samples/s on 7 GPUs at $27/h in all: ~45 h and ~$1,215."""
    per, beats = live_workers(7, NOW)
    snap = snapshot(
        total_samples=913_786,
        total_chunks=14_278,
        buckets=steady_buckets(NOW, 5.6, 15_900),
        stats={"samples_ok": 1000.0, "completion_tokens": 2_306_000.0},
        job={"started_at": str(NOW - HOUR), "gpu_tick": str(NOW), "gpu_seconds": "0"},
        per_worker=per,
        workers=beats,
        gpu_hour_usd=27 / 7,
    )
    document = progress_document(snap, NOW)
    doc = document.to_dict()
    assert doc["rates"]["samples_per_s"] == pytest.approx(5.6)
    assert doc["rates"]["tokens_per_s"] == pytest.approx(15_900)
    assert doc["eta_basis"] == "last_minute"
    assert 44.5 * HOUR < doc["eta_s"] < 46 * HOUR  # 913,786 / 5.6 = 45.3 h
    assert doc["cost"]["gpus"] == 7
    assert 1_200 < doc["cost"]["projected_total_usd"] < 1_235  # $27/h x 45.3 h
    # The token rate disagrees: 913,786 x 2,306 tok / 15,900 tok/s = 36.8 h. Both are shown.
    assert 36.3 * HOUR < doc["eta_by_tokens_s"] < 37.3 * HOUR
    text = render(document)
    assert "5.60 samples/s" in text and "15,900 tok/s" in text and "by tokens 36h" in text
    assert "7 GPUs x $3.86/GPU-h" in text and "projected total $1,2" in text


# --- the pieces ---------------------------------------------------------------------------------


def test_eta_seconds() -> None:
    assert eta_seconds(0, None) == 0.0
    assert eta_seconds(100, 0.0) is None and eta_seconds(100, None) is None
    assert eta_seconds(100, 4.0) == 25.0


def test_cost_needs_a_price_and_projection_needs_an_eta() -> None:
    assert cost(0.0, HOUR, 2, 10.0) == (None, None)
    assert cost(2.0, 3 * HOUR, 2, None) == (6.0, None)
    assert cost(2.0, 3 * HOUR, 2, HOUR) == (6.0, 10.0)


def test_window_rate_counts_only_the_last_full_minute() -> None:
    start, end = window_bounds(NOW)
    assert end - start == 60 and end <= NOW - 2.5
    buckets = {start - BUCKET_SECONDS: {"samples": 1000.0}, start: {"samples": 60.0}, end: {"samples": 500.0}}
    assert window_rate(buckets, "samples", NOW, None) == pytest.approx(1.0)


def test_window_rate_is_not_diluted_at_the_start() -> None:
    end = window_bounds(NOW)[1]
    buckets = {end - BUCKET_SECONDS: {"samples": 20.0}, end - 2 * BUCKET_SECONDS: {"samples": 20.0}}
    assert window_rate(buckets, "samples", NOW, since=end - 10) == pytest.approx(4.0)
    assert window_rate(buckets, "samples", NOW, since=end - 2) == 0.0  # too short to tell


def test_gpu_seconds_from_ticks_with_a_gap_cap_and_a_fallback() -> None:
    job = {"gpu_seconds": "100", "gpu_tick": str(NOW - 10)}
    assert gpu_seconds(job, 3, NOW, NOW - HOUR) == 130.0
    job = {"gpu_seconds": "100", "gpu_tick": str(NOW - 10 * HOUR)}  # nobody watched for 10 h
    assert gpu_seconds(job, 3, NOW, NOW - HOUR) == 100.0 + 3 * GPU_GAP_CAP
    assert gpu_seconds({}, 2, NOW, NOW - HOUR) == 2 * HOUR  # no ticks yet: live GPUs x elapsed
    assert gpu_seconds({"gpu_seconds": "7", "finished_at": str(NOW - 5)}, 2, NOW, NOW - HOUR) == 7.0


def test_eta_falls_back_to_the_since_start_rate() -> None:
    snap = snapshot(done_samples=500, done_chunks=5, job={"started_at": str(NOW - 1000)})
    doc = progress_document(snap, NOW).to_dict()
    assert doc["rates"]["samples_per_s"] == 0.0
    assert doc["rates"]["since_start"]["samples_per_s"] == pytest.approx(0.5)
    assert doc["eta_basis"] == "since_start" and doc["eta_s"] == pytest.approx(1000)
    assert doc["cost"]["usd"] is None and doc["cost"]["projected_total_usd"] is None


def test_no_rate_no_eta_and_warnings() -> None:
    doc = progress_document(snapshot(), NOW).to_dict()
    assert doc["eta_s"] is None and doc["eta_by_tokens_s"] is None
    assert any("no live worker" in w for w in doc["warnings"])
    doc = progress_document(snapshot(redis_ok=False), NOW).to_dict()
    assert any("Redis unreachable" in w for w in doc["warnings"])


def test_done_job_freezes_elapsed_and_reports_done() -> None:
    job = {"started_at": str(NOW - 100), "finished_at": str(NOW - 40), "gpu_seconds": "120", "gpu_tick": "1"}
    snap = snapshot(
        done_chunks=10,
        done_samples=1000,
        job=job,
        gpu_hour_usd=36.0,
        stats={"samples_ok": 990.0, "samples_failed": 10.0, "completion_tokens": 99_000.0},
    )
    document = progress_document(snap, NOW)
    doc = document.to_dict()
    assert doc["state"] == "done" and doc["eta_s"] == 0 and doc["eta_by_tokens_s"] == 0
    assert doc["elapsed_s"] == 60.0 and doc["finished_at"] == NOW - 40
    assert doc["samples"] == {
        "total": 1000,
        "done": 1000,
        "ok": 990,
        "failed": 10,
        "repaired": 0,
        "remaining": 0,
        "invalid_lines": 0,
    }
    assert doc["tokens"]["avg_per_sample"] == 100.0
    assert doc["cost"]["usd"] == 1.2  # 120 GPU-s at $36/GPU-h
    assert "finished  in 1m00s" in render(document)


def test_paused_state_and_lost_counters() -> None:
    snap = snapshot(
        done_chunks=5,
        done_samples=500,
        stats={"samples_ok": 100.0, "check_no_reasoning": 3.0},
        job={"state": "paused", "pause_reason": "too many empty answers"},
    )
    document = progress_document(snap, NOW)
    doc = document.to_dict()
    assert doc["state"] == "paused" and doc["pause_reason"] == "too many empty answers"
    assert doc["counters"] == {"check_no_reasoning": 3.0}
    assert any("cover 100 of 500" in w for w in doc["warnings"])
    assert "paused (too many empty answers)" in render(document)


def test_per_worker_rows() -> None:
    per, beats = live_workers(2, NOW)
    beats["gpu1@h"]["last_seen"] = str(NOW - 120)  # gone
    beats["gpu0@h"] |= {"inflight": "40", "max_inflight": "48", "server_accept_length": "3.2"}
    buckets = steady_buckets(NOW, 2.0, 4000.0, worker="gpu0@h")
    document = progress_document(snapshot(per_worker=per, workers=beats, buckets=buckets), NOW)
    doc = document.to_dict()
    gpu0, gpu1 = doc["workers"]
    assert gpu0["alive"] and not gpu1["alive"] and doc["cost"]["gpus"] == 1
    assert gpu0["samples_per_s"] == pytest.approx(2.0) and gpu0["tokens_per_s"] == pytest.approx(4000)
    assert gpu0["inflight"] == 40
    # no sample reported verify passes: the server's lifetime figure, labelled as such
    assert (gpu0["spec_accept_length"], gpu0["spec_accept_source"]) == (3.2, "server_lifetime")
    assert doc["spec_accept_length"] == 3.2 and doc["spec"]["source"] == "server_lifetime"
    assert doc["spec"]["job"] is None and doc["spec"]["verify_passes"] == 0
    text = render(document)
    assert "gpu0@h" in text and "40/48" in text and "gone" in text
    assert "3.20*" in text and "lifetime average" in text


def spec_buckets(now: float, rows: dict[str, tuple[float, float]]) -> dict[int, dict[str, float]]:
    """A window of buckets in which each worker adds (spec tokens, verify passes) per bucket."""
    start, end = window_bounds(now)
    out: dict[int, dict[str, float]] = {}
    for b in range(start, end, BUCKET_SECONDS):
        row: dict[str, float] = {}
        for worker, (tokens, verify) in rows.items():
            row[f"{worker}|spec_tokens"], row[f"{worker}|verify"] = tokens, verify
            row["spec_tokens"] = row.get("spec_tokens", 0.0) + tokens
            row["verify"] = row.get("verify", 0.0) + verify
        out[b] = row
    return out


def test_accept_length_is_tokens_over_verify_passes_of_the_samples() -> None:
    """Known per-sample numbers: job, window and per GPU are ratios of sums, not means of ratios."""
    samples = [(300, 100), (100, 50), (400, 100)]  # (tokens, verify): 3.0, 2.0 and 4.0 per pass
    assert sum(t for t, _ in samples) / sum(v for _, v in samples) == 3.2  # the mean of ratios is 3.0
    per, beats = live_workers(2, NOW)
    per["gpu0@h"] |= {"spec_tokens": 400.0, "verify": 150.0}  # samples 1 and 2: 2.667
    per["gpu1@h"] |= {"spec_tokens": 400.0, "verify": 100.0}  # sample 3: 4.0
    beats["gpu0@h"]["server_accept_length"] = "3.6"  # the server's lifetime figure is not used
    stats = {"samples_ok": 3.0, "completion_tokens": 800.0, "spec_tokens": 800.0, "spec_verify_ct": 250.0}
    buckets = spec_buckets(NOW, {"gpu0@h": (30.0, 10.0), "gpu1@h": (50.0, 25.0)})  # last minute: 80/35
    document = progress_document(snapshot(per_worker=per, workers=beats, stats=stats, buckets=buckets), NOW)
    doc = document.to_dict()
    spec = doc["spec"]
    assert spec["source"] == "per_request" and doc["spec_accept_length"] == spec["job"] == 3.2
    assert (spec["tokens"], spec["verify_passes"]) == (800, 250)
    assert spec["window"] == round(80 / 35, 3) and spec["server_lifetime"] == 3.6
    gpu0, gpu1 = doc["workers"]
    assert (gpu0["spec_accept_length"], gpu0["spec_accept_source"]) == (round(400 / 150, 3), "per_request")
    assert gpu0["spec_accept_length_window"] == 3.0 and gpu0["server_accept_length"] == 3.6
    assert (gpu1["spec_accept_length"], gpu1["spec_accept_length_window"]) == (4.0, 2.0)
    assert "spec_tokens" not in doc["counters"] and "spec_verify_ct" not in doc["counters"]
    text = render(document)
    assert "accept length 3.20 per request" in text and "250 passes" in text and "last minute 2.29" in text
    assert "2.67" in text and "*" not in text
    # before any chunk is stored, the job's figure comes from the workers' live totals
    early = progress_document(snapshot(per_worker=per, workers=beats), NOW).to_dict()
    assert early["spec"]["job"] == 3.2 and early["spec"]["source"] == "per_request"


def test_no_accept_length_at_all() -> None:
    per, beats = live_workers(1, NOW)
    document = progress_document(snapshot(per_worker=per, workers=beats), NOW)
    doc = document.to_dict()
    assert doc["spec_accept_length"] is None and doc["spec"]["source"] is None
    assert doc["workers"][0]["spec_accept_source"] is None
    assert "spec " not in render(document)


def test_error_kinds_come_from_the_error_never_from_its_text() -> None:
    assert metrics.error_kind(RetryableError("HTTP 503: queue full", ErrorKind.HTTP_503)) == "http_503"
    assert metrics.error_kind(RetryableError("HTTP 503: looks like one")) == "other"  # no kind: not parsed
    assert metrics.error_kind(SampleRejected("HTTP 400: too long")) == "rejected"
    assert metrics.error_kind(ValueError("a bug")) == "other"
    assert [ErrorKind.of_status(c) for c in (400, 401, 429, 500, 502, 503)] == [
        ErrorKind.REJECTED,
        ErrorKind.HTTP_4XX,
        ErrorKind.HTTP_4XX,
        ErrorKind.HTTP_5XX,
        ErrorKind.HTTP_5XX,
        ErrorKind.HTTP_503,
    ]


def test_the_client_sets_the_kind_of_each_failure() -> None:
    with pytest.raises(RetryableError) as bad:
        parse_completion(b"not json")
    assert bad.value.kind == ErrorKind.BAD_RESPONSE
    aborted = b'{"choices": [{"message": {"content": ""}, "finish_reason": "abort"}]}'
    with pytest.raises(RetryableError) as abort:
        parse_completion(aborted)
    assert abort.value.kind == ErrorKind.ABORT
    with pytest.raises(RetryableError) as refused:
        SGLangClient(f"http://127.0.0.1:{free_port()}", timeout=2).chat(
            ChatRequest(GenerationSpec("m"), [], "r")
        )
    assert refused.value.kind == ErrorKind.CONNECTION


# --- the Redis data path ------------------------------------------------------------------------


@pytest.fixture
def bk(redis_server: RedisServer) -> Bookkeeping:
    return Bookkeeping(redis_server.client(), f"ut-{uuid.uuid4().hex[:8]}")


def staged_store(root: Path, samples: int = 100, chunk_size: int = 10) -> tuple[LocalStore, JobDefinition]:
    store = LocalStore(root)
    job = JobDefinition.create("sha256:x", "p.jsonl", GenerationSpec(model="m", chunk_size=chunk_size))
    chunks = -(-samples // chunk_size)
    store.write("job.json", job.to_json())
    store.write("manifest.json", Manifest(job.job_id, samples, samples, 0, chunk_size, chunks).to_json())
    return store, job


def test_worker_counts_reach_progress_json(bk: Bookkeeping, tmp_path: Path) -> None:
    store, job = staged_store(tmp_path)
    bk.register_job(job.job_id, str(tmp_path))
    stats = WorkerStats(bk, "gpu0@h")
    t0 = NOW - 30
    stats.chunk_started(job.job_id, now=t0)
    for i in range(20):  # 20 samples over 20 s, 50 tokens each; two chunks stored
        ok = i != 0
        verify = (10 if i % 2 else 25) if ok else 0  # accept lengths 5.0 and 2.0: 950 / 325 in all
        stats.sample_done(
            job.job_id, ok=ok, tokens=50, spec_tokens=50 if ok else 0, verify=verify, now=t0 + i
        )
    stats.chunk_done(job.job_id)
    stats.chunk_done(job.job_id)
    stats.flush(
        {"endpoint": "http://e0", "inflight": 7, "healthy": True, "server_accept_length": 3.1}, now=NOW
    )
    for c in (0, 1):
        store.write(output_key(c), b"{}\n")
    spec = {"spec_tokens": 450, "spec_verify_ct": 150}  # chunk 0: samples 1-9 (5 odd, 4 even)
    bk.complete(job.job_id, 0, {"samples_ok": 9, "samples_failed": 1, "completion_tokens": 450, **spec})
    spec = {"spec_tokens": 500, "spec_verify_ct": 175}  # chunk 1: samples 10-19
    bk.complete(job.job_id, 1, {"samples_ok": 10, "completion_tokens": 500, **spec})

    writer = ProgressWriter(bk, "gpu0@h", period=5.0, default_gpu_hour_usd=3.6)
    assert writer.write_if_due(job.job_id, store, now=NOW) is not None
    assert writer.write_if_due(job.job_id, store, now=NOW) is None  # another write within the period
    doc = json.loads(store.read(PROGRESS_KEY))
    assert doc["writer"] == "gpu0@h" and doc["state"] == "running" and doc["started_at"] == t0
    assert doc["samples"]["done"] == 20 and doc["samples"]["failed"] == 1 and doc["chunks"]["done"] == 2
    assert doc["tokens"]["generated"] == 950 and doc["tokens"]["avg_per_sample"] == 50.0
    (w,) = doc["workers"]
    assert w["name"] == "gpu0@h" and w["samples"] == 20 and w["failed"] == 1 and w["chunks"] == 2
    assert w["tokens"] == 1000 and w["inflight"] == 7 and w["healthy"] and w["alive"]
    assert (w["spec_accept_length"], w["spec_accept_source"]) == (round(950 / 325, 3), "per_request")
    assert w["server_accept_length"] == 3.1
    # the 17 samples of the window (t0 + 3 .. t0 + 19) in 5-second buckets: Σ tokens / Σ verify
    start, end = window_bounds(NOW)
    in_window = [i for i in range(1, 20) if start <= (t0 + i) // BUCKET_SECONDS * BUCKET_SECONDS < end]
    window_verify = sum(10 if i % 2 else 25 for i in in_window)
    assert w["spec_accept_length_window"] == round(50 * len(in_window) / window_verify, 3)
    assert doc["spec"]["job"] == doc["spec_accept_length"] == round(950 / 325, 3)
    assert doc["spec"]["verify_passes"] == 325 and doc["spec"]["source"] == "per_request"
    # 20 samples finished in the 27.5 s between the first chunk and the window's end
    assert doc["rates"]["samples_per_s"] == pytest.approx(20 / (window_bounds(NOW)[1] - t0))
    assert doc["cost"]["gpus"] == 1 and doc["cost"]["gpu_hours"] == pytest.approx(30 / HOUR, rel=0.01)
    assert doc["cost"]["usd"] == pytest.approx(0.03)
    assert (
        compute_document(store, bk, job.job_id, NOW).to_dict()["samples"] == doc["samples"]
    )  # status agrees


def test_progress_survives_a_redis_flush(bk: Bookkeeping, tmp_path: Path) -> None:
    store, job = staged_store(tmp_path)
    bk.register_job(job.job_id, str(tmp_path))
    stats = WorkerStats(bk, "gpu0@h")
    stats.chunk_started(job.job_id, now=NOW - 600)
    stats.flush({}, now=NOW - 600)
    writer = ProgressWriter(bk, "w", period=1.0, default_gpu_hour_usd=1.0)
    for t in range(0, 600, 5):  # ten minutes of one live GPU
        stats.flush({}, now=NOW - 600 + t)
        writer.write(job.job_id, store, now=NOW - 600 + t + 1)
    before = json.loads(store.read(PROGRESS_KEY))
    assert before["cost"]["gpu_hours"] == pytest.approx(596 / HOUR, rel=0.02)
    bk.client.flushall()
    stats.flush({}, now=NOW)  # the worker keeps beating; started_at is gone from Redis
    after = ProgressWriter(bk, "w2", period=1.0).write(job.job_id, store, now=NOW + 1)
    assert after["started_at"] == NOW - 600
    assert after["cost"]["gpu_hour_usd"] == 1.0
    assert after["cost"]["gpu_hours"] >= before["cost"]["gpu_hours"]


def test_finished_job_is_written_once_more_then_left_alone(bk: Bookkeeping, tmp_path: Path) -> None:
    store, job = staged_store(tmp_path, samples=10)
    bk.register_job(job.job_id, str(tmp_path))
    store.write(output_key(0), b"{}\n")
    writer = ProgressWriter(bk, "w", period=1.0)
    doc = writer.write(job.job_id, store, now=NOW)
    assert doc["state"] == "done" and doc["finished_at"] == NOW
    assert job.job_id in registered_jobs(bk)  # a few more writes, for the workers' last counts
    doc = writer.write(job.job_id, store, now=NOW + FINAL_AFTER)
    assert doc["finished_at"] == NOW and doc["elapsed_s"] is None  # never started: no elapsed time
    assert bk.job_info(job.job_id)["progress_final"] == "1"
    assert job.job_id not in registered_jobs(bk)


def test_status_without_redis_uses_the_store_and_the_last_progress_json(
    bk: Bookkeeping, tmp_path: Path
) -> None:
    store, job = staged_store(tmp_path, samples=30)
    bk.register_job(job.job_id, str(tmp_path))
    for c in (0, 1):
        store.write(output_key(c), b"{}\n")
        spec = {"spec_tokens": 900, "spec_verify_ct": 300 + 100 * c}
        bk.complete(job.job_id, c, {"samples_ok": 9, "samples_failed": 1, "completion_tokens": 900, **spec})
    stats = WorkerStats(bk, "gpu0@h")
    stats.chunk_started(job.job_id, now=NOW - 100)
    stats.flush({}, now=NOW - 100)
    stats.flush({}, now=NOW - 51)  # a heartbeat: one live GPU since NOW - 100
    ProgressWriter(bk, "w", period=1.0, default_gpu_hour_usd=2.0).write(job.job_id, store, now=NOW - 50)
    store.write(output_key(2), b"{}\n")  # a chunk stored while Redis is away
    doc = compute_document(store, None, job.job_id, NOW).to_dict()
    assert doc["samples"]["done"] == 30 and doc["state"] == "done"  # the store is the truth
    assert doc["samples"]["failed"] == 2 and doc["tokens"]["generated"] == 1800  # as of progress.json
    assert doc["started_at"] == NOW - 100 and doc["cost"]["gpu_hour_usd"] == 2.0
    assert doc["cost"]["gpu_hours"] == pytest.approx(50 / HOUR, rel=0.01)
    assert any("Redis unreachable" in w for w in doc["warnings"])
    assert any("from progress.json" in w for w in doc["warnings"])
    assert doc["spec"]["job"] == round(1800 / 700, 3) and doc["spec"]["source"] == "per_request"


def test_worker_recent_accept_length_covers_the_last_minute(bk: Bookkeeping) -> None:
    stats = WorkerStats(bk, "gpu0@h")
    assert stats.recent_accept_length(now=NOW) is None
    stats.sample_done("j", ok=True, tokens=400, spec_tokens=400, verify=100, now=NOW - 90)  # too old
    stats.sample_done("j", ok=True, tokens=300, spec_tokens=300, verify=150, now=NOW - 30)
    stats.sample_done("j", ok=True, tokens=90, spec_tokens=90, verify=30, now=NOW - 5)
    stats.sample_done("j", ok=True, tokens=70, now=NOW - 1)  # no speculative stats: not counted
    assert stats.recent_accept_length(now=NOW) == pytest.approx(390 / 180)
    assert stats.recent_accept_length(now=NOW + 60) is None


def test_worker_keeps_only_the_last_minute_of_accept_length_entries(bk: Bookkeeping) -> None:
    # Nothing may scrape the last-minute figure (no metrics port): the entries must not pile up.
    stats = WorkerStats(bk, "gpu0@h")
    for i in range(3000):  # 10 samples/s for 300 s
        stats.sample_done("j", ok=True, tokens=40, spec_tokens=40, verify=10, now=NOW + i / 10)
    assert len(stats._recent) <= 10 * 60 + 1
    assert stats.recent_accept_length(now=NOW + 300) == pytest.approx(4.0)


def test_a_multi_turn_job_is_measured_in_turns() -> None:
    """300 samples of 3 turns = 900 generations; 300 turns done, 2 turns/s: 5 minutes left, not 1,000 s."""
    per, beats = live_workers(1, NOW)
    start, end = window_bounds(NOW)
    buckets = {
        b: {"samples": 0.6 * BUCKET_SECONDS, "turns": 2.0 * BUCKET_SECONDS} for b in range(start, end, 5)
    }
    snap = snapshot(
        total_samples=300,
        total_chunks=30,
        done_chunks=10,
        done_samples=100,
        total_turns=900,
        done_turns=300,
        buckets=buckets,
        stats={"samples_ok": 100.0, "generations": 290.0, "completion_tokens": 1000.0},
        job={"started_at": str(NOW - HOUR), "gpu_tick": str(NOW), "gpu_seconds": "0"},
        per_worker=per,
        workers=beats,
        gpu_hour_usd=3.6,
    )
    document = progress_document(snap, NOW)
    doc = document.to_dict()
    assert doc["turns"] == {"total": 900, "done": 300, "remaining": 600, "generated": 290}
    assert doc["eta_unit"] == "turns" and doc["rates"]["turns_per_s"] == pytest.approx(2.0)
    assert doc["eta_s"] == pytest.approx(300) and doc["cost"]["projected_total_usd"] == pytest.approx(0.3)
    text = render(document)
    assert "turns     300 / 900 done | 290 generated | 600 left" in text and "2.00 turns/s" in text
    assert "from the last-minute turn rate" in text
    single = progress_document(
        snapshot(done_samples=500, done_chunks=5, job={"started_at": str(NOW - 1000)}), NOW
    ).to_dict()
    assert single["eta_unit"] == "samples" and single["turns"]["total"] == 1000  # a turn per sample


def test_a_flush_while_redis_is_away_keeps_the_counts_for_the_next(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        bk = Bookkeeping(server.client(), "ut-away")
        stats = WorkerStats(bk, "gpu0@h")
        stats.chunk_started("j", now=NOW - 10)
        stats.sample_done("j", ok=True, tokens=50, now=NOW - 5)
        stats.chunk_done("j")
        server.stop()
        with pytest.raises(RetryableError, match="pushing live stats"):  # what the flush loop catches
            stats.flush({}, now=NOW)
        stats.sample_done("j", ok=False, tokens=0, now=NOW - 1)
        server.start()
        stats.flush({}, now=NOW)
        per_worker = bk.client.hgetall("ut-away:job:j:workers")
        assert per_worker[b"gpu0@h|samples"] == b"2" and per_worker[b"gpu0@h|failed"] == b"1"
        assert per_worker[b"gpu0@h|chunks"] == b"1" and float(per_worker[b"gpu0@h|first"]) == NOW - 10
    finally:
        server.stop()


# --- the live yield ------------------------------------------------------------------------------


def yield_stats() -> dict[str, float]:
    """Counters of 8 counted chunks: 99,000 tokens generated in all, 90,000 of them counted."""
    return {
        "samples_ok": 990.0,
        "samples_failed": 10.0,
        "completion_tokens": 99_000.0,
        "yield_counted_chunks": 8.0,
        "yield_generated_tokens": 90_000.0,
        "yield_trainable_tokens": 72_000.0,
        "yield_written_generated": 80_000.0,
        "yield_past_max_length": 3_000.0,
        "yield_failed_turns": 1_000.0,
        "yield_superseded": 2_000.0,
        "yield_horizon_rows": 4.0,
        "yield_dropped_truncated": 7_000.0,
        "yield_dropped_empty_answer": 0.0,  # dropped rows a repair round replaced
    }


def test_the_yield_section_is_the_workers_tally_with_its_cost() -> None:
    job = {"started_at": str(NOW - 100), "finished_at": str(NOW - 40), "gpu_seconds": "120", "gpu_tick": "1"}
    snap = snapshot(done_chunks=10, done_samples=1000, job=job, gpu_hour_usd=36.0, stats=yield_stats())
    document = progress_document(snap, NOW)
    doc = document.to_dict()
    section = doc["yield"]
    assert section["generated_tokens"] == 90_000 and section["trainable_tokens"] == 72_000
    assert section["yield"] == 0.8 and section["generated_per_trainable"] == 1.25
    assert section["where_the_rest_went"] == {
        "dropped_rows": {"truncated": 7_000},
        "failed_turns": 1_000,
        "superseded": 2_000,
        "looping": 0,
        "past_max_length": 3_000,
        "untrained_in_written_rows": 80_000 - 72_000 - 3_000,
    }
    assert section["rows_written_by_horizon_rule"] == 4 and section["counted_chunks"] == 8
    # $1.20 for 99,000 generated tokens ($12.12 a million), at a yield of 0.8
    assert section["usd_per_million_trainable"] == pytest.approx(1.2 / 99_000 * 1e6 / 0.8, abs=1e-4)
    text = render(document)
    assert (
        "yield     0.800: 72,000 trainable of 90,000 generated tokens | $15.15 per million trainable" in text
    )
    assert "rest: dropped truncated 7.8%, untrained 5.6%, past max_length 3.3%" in text
    assert "over 8 of 10 stored chunks (the rest not counted)" in text


def test_no_counted_chunk_no_yield_section() -> None:
    document = progress_document(snapshot(stats={"samples_ok": 10.0, "completion_tokens": 1_000.0}), NOW)
    doc = document.to_dict()
    assert doc["yield"] is None and "yield" not in render(document).split("trainable")[0]


def test_a_finished_jobs_yield_comes_back_from_its_final_progress_json(tmp_path: Path) -> None:
    from dflash_tasks.monitoring.settled import from_final

    job = {"started_at": str(NOW - 100), "finished_at": str(NOW - 40), "gpu_seconds": "120", "gpu_tick": "1"}
    final = progress_document(
        snapshot(done_chunks=10, done_samples=1000, job=job, gpu_hour_usd=36.0, stats=yield_stats()), NOW
    ).to_dict()
    lost = snapshot(done_chunks=10, done_samples=1000, redis_ok=False)
    again = progress_document(from_final(lost, json.loads(json.dumps(final))), NOW + 3600).to_dict()
    price = "usd_per_million_trainable"  # from the GPU-hours the document keeps to 4 digits
    assert again["yield"][price] == pytest.approx(final["yield"][price], rel=2e-3)
    assert {**again["yield"], price: None} == {**final["yield"], price: None}
