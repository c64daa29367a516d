"""A finished job reads right after Redis is gone (against a private Redis, flushed)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.progress_keys import PROGRESS_KEY
from dflash_tasks.core.job import GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.monitoring.progress import compute_document
from dflash_tasks.monitoring.progress_writer import FINAL_AFTER, ProgressWriter
from dflash_tasks.monitoring.status_view import render
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer
from workers.monitor.live_stats import WorkerStats

NOW = 1_800_000_000.0
SAMPLES, CHUNK = 60, 10
LATER = 45 * 60.0  # the user comes back 45 minutes later


@pytest.fixture
def bk(redis_server: RedisServer) -> Bookkeeping:
    return Bookkeeping(redis_server.client(), f"ut-{uuid.uuid4().hex[:8]}")


def tokens_of(i: int) -> int:
    return 40 + i  # 60 samples: 40..99 tokens, 4,170 in all


def finished_job(bk: Bookkeeping, root: Path) -> tuple[LocalStore, str]:
    """A 60-sample job run by one worker from NOW - 2.9 to NOW, its records stored, one failed."""
    store = LocalStore(root)
    job = JobDefinition.create("sha256:x", "p.jsonl", GenerationSpec(model="m", chunk_size=CHUNK))
    store.write("job.json", job.to_json())
    store.write("manifest.json", Manifest(job.job_id, SAMPLES, SAMPLES, 0, CHUNK, SAMPLES // CHUNK).to_json())
    bk.register_job(job.job_id, str(root))
    stats = WorkerStats(bk, "gpu0@h")
    stats.chunk_started(job.job_id, now=NOW - 2.9)
    writer = ProgressWriter(bk, "gpu0@h", period=1.0, default_gpu_hour_usd=3.6)
    writer.write(job.job_id, store, now=NOW - 2.9)
    for c in range(SAMPLES // CHUNK):
        lines, counts = [], {"samples_ok": 0, "samples_failed": 0, "completion_tokens": 0, "prompt_tokens": 0}
        for i in range(c * CHUNK, (c + 1) * CHUNK):
            ok = i != 7
            lines.append(
                json.dumps(
                    {
                        "id": f"s{i}",
                        "status": "ok" if ok else "failed",
                        "content": "x" if ok else "",
                        "error": None if ok else "boom",
                        "usage": {"prompt_tokens": 5, "completion_tokens": tokens_of(i) if ok else 0},
                    }
                )
            )
            counts["samples_ok" if ok else "samples_failed"] += 1
            counts["completion_tokens"] += tokens_of(i) if ok else 0
            counts["prompt_tokens"] += 5
            stats.sample_done(job.job_id, ok=ok, tokens=tokens_of(i) if ok else 0, now=NOW - 2)
        store.write(output_key(c), ("\n".join(lines) + "\n").encode())
        bk.complete(job.job_id, c, counts)
        stats.chunk_done(job.job_id)
    stats.flush({"endpoint": "http://e0"}, now=NOW)
    for t in (NOW, NOW + FINAL_AFTER):  # done, then final once the late counts had time to land
        writer.write(job.job_id, store, now=t)
    return store, job.job_id


def test_a_finished_job_reads_from_its_final_progress_json_after_redis_lost_its_counters(
    bk: Bookkeeping, tmp_path: Path
) -> None:
    store, job_id = finished_job(bk, tmp_path)
    final = json.loads(store.read(PROGRESS_KEY))
    assert final["state"] == "done" and final["elapsed_s"] == 2.9
    assert final["tokens"]["generated"] == 4170 - tokens_of(7) and final["samples"]["failed"] == 1
    bk.client.flushall()  # a Redis restart without its data: none of the job's counters are left

    document = compute_document(store, bk, job_id, NOW + LATER)
    doc = document.to_dict()
    assert doc["state"] == "done" and doc["finished_at"] == final["finished_at"] == NOW
    assert doc["elapsed_s"] == 2.9  # not 45 minutes
    assert doc["tokens"] == final["tokens"] and doc["samples"] == final["samples"]
    assert (
        doc["cost"]["gpu_hours"] == final["cost"]["gpu_hours"] and doc["cost"]["usd"] == final["cost"]["usd"]
    )
    assert any("final progress.json" in w for w in doc["warnings"])
    text = render(document)
    assert re.search(r"finished +in 2s", text) and "4,123 generated" in text

    # a writer that comes by later (the job is still listed somewhere) leaves the final file alone
    ProgressWriter(bk, "gpu1@h", period=1.0).write(job_id, store, now=NOW + LATER)
    assert json.loads(store.read(PROGRESS_KEY)) == final


def test_without_a_final_progress_json_the_counts_are_recounted_from_the_records(
    bk: Bookkeeping, tmp_path: Path
) -> None:
    store, job_id = finished_job(bk, tmp_path)
    store.delete(PROGRESS_KEY)  # lost before the end, or never written
    bk.client.flushall()

    document = compute_document(store, bk, job_id, NOW + LATER)
    doc = document.to_dict()
    assert doc["state"] == "done" and doc["samples"]["done"] == SAMPLES
    assert doc["samples"]["failed"] == 1 and doc["samples"]["ok"] == SAMPLES - 1
    assert doc["tokens"]["generated"] == 4170 - tokens_of(7) and doc["tokens"]["prompt"] == 5 * SAMPLES
    assert doc["finished_at"] is None and doc["elapsed_s"] is None  # unknown, never now - start
    assert any("recounted from its 60 stored records" in w for w in doc["warnings"])
    assert re.search(r"finished +in --", render(document))


def test_a_running_job_after_a_flush_is_not_taken_for_a_finished_one(bk: Bookkeeping, tmp_path: Path) -> None:
    store, job_id = finished_job(bk, tmp_path)
    store.delete(output_key(5))  # one chunk still to do
    bk.client.flushall()
    doc = compute_document(store, bk, job_id, NOW + LATER).to_dict()
    assert doc["state"] != "done" and doc["samples"]["done"] == SAMPLES - CHUNK
    assert not any("finished job" in w for w in doc["warnings"])


def test_a_progress_json_that_is_not_final_gives_its_start_but_never_now_minus_start(
    bk: Bookkeeping, tmp_path: Path
) -> None:
    store, job_id = finished_job(bk, tmp_path)
    earlier = json.loads(store.read(PROGRESS_KEY))
    earlier |= {"state": "running", "finished_at": None, "samples": {**earlier["samples"], "done": 30}}
    assert earlier["started_at"]  # a start time, and a document that is not the final one
    store.write(PROGRESS_KEY, json.dumps(earlier).encode())
    bk.client.flushall()

    doc = compute_document(store, bk, job_id, NOW + LATER).to_dict()
    assert any("recounted from its 60 stored records" in w for w in doc["warnings"])
    assert doc["started_at"] == earlier["started_at"]
    assert doc["finished_at"] is None and doc["elapsed_s"] is None  # not 45 minutes


def test_the_repaired_count_survives_redis_losing_the_counters(bk: Bookkeeping, tmp_path: Path) -> None:
    store, job_id = finished_job(bk, tmp_path)
    final = json.loads(store.read(PROGRESS_KEY))
    final["samples"]["repaired"] = 3  # as a job whose repair rounds regenerated three samples
    store.write(PROGRESS_KEY, json.dumps(final).encode())
    bk.client.flushall()

    doc = compute_document(store, bk, job_id, NOW + LATER).to_dict()
    assert doc["samples"]["repaired"] == 3
