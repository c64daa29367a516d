"""The delivery handler on failing chunks: re-queued with a growing delay, parked after repeated
permanent failures (left out of re-plans), and ``resume`` queueing them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dflash_tasks.coord.progress_keys import PROGRESS_KEY
from dflash_tasks.coord.publish import queued_chunks
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.job import input_key, output_key
from dflash_tasks.monitoring.progress_writer import FINAL_AFTER, ProgressWriter
from tests.helpers import REPO
from tests.workers.chunk_support import Staged
from workers.delivery import DeliveryHandler, HeldChunks
from workers.flow.health import HealthGate
from workers.flow.prefetch import PrefetchController
from workers.recovery.delivery_failures import MAX_CHUNK_FAILURES, DeliveryFailures
from workers.recovery.requeue import Requeuer


@pytest.fixture
def delivery(staged: Staged) -> Iterator[DeliveryHandler]:
    app = staged.app()
    health = HealthGate(lambda: True, 1.0, on_down=lambda: None, on_up=lambda: None)
    requeuer = Requeuer(staged.settings, staged.bk, staged.ctx.jobs, app)
    failures = DeliveryFailures(staged.bk, requeuer, health, staged.settings.requeue_backoff)
    prefetch = PrefetchController(held=lambda: 0, backlog=lambda: 0, low_water=1, max_chunks=1)
    yield DeliveryHandler(staged.ctx, "ut@host", health, prefetch, HeldChunks(), failures)
    app.close()


def job_queue(staged: Staged) -> str:
    """The queue of the job's model: where its chunks are put back."""
    return model_queue(staged.settings.queue, "Qwen/Qwen3-8B")


def queue_length(staged: Staged) -> int:
    return int(staged.bk.client.llen(job_queue(staged)))


def break_input(staged: Staged, chunk: int) -> bytes:
    """Make reading the chunk's input a permanent store error (a folder where its file should be)."""
    path = staged.root / input_key(chunk)
    data = path.read_bytes()
    path.unlink()
    path.mkdir()
    return data


def test_a_chunk_failing_permanently_is_parked_after_the_limit_and_left_out_of_replans(
    staged: Staged, delivery: DeliveryHandler
) -> None:
    job = staged.job_id
    break_input(staged, 1)
    for n in range(1, MAX_CHUNK_FAILURES):
        result = delivery.handle(job, 1, f"t{n}")
        assert result.status == "requeued" and "StoreError" in result.reason, result
        assert queue_length(staged) == n  # one message each time, with a growing countdown
    parked = delivery.handle(job, 1, "t-last")
    assert parked.status == "parked" and "StoreError" in parked.reason, parked
    assert queue_length(staged) == MAX_CHUNK_FAILURES - 1  # not queued again
    assert list(staged.bk.parked(job)) == [1] and "inputs/chunk-000001.jsonl" in staged.bk.parked(job)[1]
    assert staged.bk.live_leases(job) == {}

    staged.bk.client.delete(job_queue(staged))  # its messages are gone: only a re-plan finds it
    assert delivery.failures.requeuer.replan_job(job) == [0, 2]  # the parked chunk stays out
    assert queued_chunks(staged.bk.client, job_queue(staged), job) == {0, 2}


def test_a_corrupt_staged_chunk_is_parked_not_retried_forever(
    staged: Staged, delivery: DeliveryHandler
) -> None:
    (staged.root / input_key(2)).write_bytes(b'{"id": "q1", "messages": [')  # a damaged staged file
    for n in range(1, MAX_CHUNK_FAILURES):
        result = delivery.handle(staged.job_id, 2, f"c{n}")
        assert result.status == "requeued" and "inputs/chunk-000002.jsonl:1" in result.reason, result
    parked = delivery.handle(staged.job_id, 2, "c-last")
    assert parked.status == "parked" and "not a staged sample" in parked.reason, parked


def test_retryable_failures_are_requeued_however_often_they_come(
    staged: Staged, delivery: DeliveryHandler
) -> None:
    for _ in range(MAX_CHUNK_FAILURES + 2):
        result = delivery.failures.outcome_of(
            RetryableError("Redis error while reading leases"), staged.job_id, 2
        )
        assert result.status == "requeued"
    assert staged.bk.parked(staged.job_id) == {}
    assert queue_length(staged) == MAX_CHUNK_FAILURES + 2


def test_a_paused_jobs_delivery_is_not_run(staged: Staged, delivery: DeliveryHandler) -> None:
    staged.bk.pause_job(staged.job_id, "quality gate")
    result = delivery.handle(staged.job_id, 0, "t1")
    assert (result.status, result.reason, result.cause, result.samples_ok) == (
        "paused",
        "quality gate",
        "",
        0,
    )
    assert staged.sim_log()["received"] == 0 and not staged.store.exists(output_key(0))
    assert staged.bk.live_leases(staged.job_id) == {}  # the lease taken to read the pause is given back


def resume(staged: Staged) -> dict[str, object]:
    env = {
        **os.environ,
        "DFLASH_BROKER_URL": staged.settings.broker_url,
        "DFLASH_REDIS_PREFIX": staged.settings.redis_prefix,
        "DFLASH_QUEUE": staged.settings.queue,
    }
    res = subprocess.run(
        [sys.executable, "-m", "dflash_tasks.producer.resume", "--output", str(staged.root), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def test_resume_unparks_unpauses_and_queues_only_what_is_missing(
    staged: Staged, delivery: DeliveryHandler
) -> None:
    job = staged.job_id
    assert delivery.handle(job, 0, "t0").status == "done"
    original = break_input(staged, 1)
    for n in range(MAX_CHUNK_FAILURES):
        delivery.handle(job, 1, f"t{n}")
    assert list(staged.bk.parked(job)) == [1]
    staged.bk.pause_job(job, "quality gate: too many samples without reasoning")
    staged.bk.client.delete(job_queue(staged))
    staged.bk.acquire(job, 2, "alive@h/t9/dddddd", 60)  # running on a live worker
    (staged.root / input_key(1)).rmdir()
    (staged.root / input_key(1)).write_bytes(original)  # the cause fixed

    summary = resume(staged)
    assert summary == {"job_id": job, "was_paused": True, "chunks_enqueued": 1}
    assert queued_chunks(staged.bk.client, job_queue(staged), job) == {1}  # not 0 (done), not 2 (running)
    assert staged.bk.job_state(job) == ("running", "")
    assert staged.bk.parked(job) == {} and staged.bk.count_chunk_failure(job, 1) == 1  # failures forgotten
    assert delivery.handle(job, 1, "t-after").status == "done"
    assert staged.sim_log()["wasted"] == 0


def test_a_finished_job_stays_registered_until_its_final_progress_json_is_written(
    staged: Staged, delivery: DeliveryHandler
) -> None:
    # Unregistered at once, a job run without `enqueue --wait` kept a "running" progress.json:
    # the writers only write registered jobs, and the re-plan could come before their next write.
    job = staged.job_id
    for chunk in range(3):
        assert delivery.handle(job, chunk, f"f{chunk}").status == "done"
    assert delivery.failures.requeuer.replan_job(job) == []
    assert job in staged.bk.jobs()  # its final progress.json is not written yet
    writer = ProgressWriter(staged.bk, "ut@host", period=1.0)
    now = time.time()
    assert writer.write(job, staged.store, now=now)["state"] == "done"
    writer.write(job, staged.store, now=now + FINAL_AFTER)  # final: the workers' last counts are in
    assert json.loads(staged.store.read(PROGRESS_KEY))["state"] == "done"
    assert delivery.failures.requeuer.replan_job(job) == []
    assert job not in staged.bk.jobs()
