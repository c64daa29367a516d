"""Tests for the planner and publish.queued_chunks: store outputs, Redis leases, broker queue."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.celery_app import TASK_NAME, configure
from dflash_tasks.coord.planner import plan_job, queue_missing, registered_location
from dflash_tasks.coord.publish import publish_chunks, publish_repairs, queued_chunks, task_id
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.job import output_key
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.store import LocalStore
from tests.helpers import free_port, redis_url

JOB = "0123456789abcdef"
OTHER = "fedcba9876543210"


@pytest.fixture
def queue(prefix: str) -> str:
    return f"{prefix}-queue"  # deleted with the prefix


@pytest.fixture
def bk(rclient: redis.Redis, prefix: str) -> Bookkeeping:
    return Bookkeeping.from_url(redis_url(rclient), prefix)


def celery_message(tid: str, chunk_args: tuple[str, int] = (JOB, 0)) -> bytes:
    """A message as kombu's Redis transport stores it (protocol 2, JSON body)."""
    body = json.dumps(
        [list(chunk_args), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    return json.dumps(
        {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"lang": "py", "task": TASK_NAME, "id": tid, "root_id": tid, "retries": 0},
            "properties": {"correlation_id": tid, "delivery_tag": str(uuid.uuid4()), "priority": 0},
        }
    ).encode()


def push(client: redis.Redis, queue: str, *raw: bytes) -> None:
    for item in raw:
        client.lpush(queue, item)


def store_with_outputs(tmp_path: Path, chunks: list[int]) -> LocalStore:
    store = LocalStore(tmp_path / "out")
    for chunk in chunks:
        store.write(output_key(chunk), b'{"id": "x"}\n')
    return store


# -- queued_chunks ---------------------------------------------------------------------------------------


def test_task_id_format() -> None:
    tid = task_id(JOB, 42)
    job, chunk, nonce = tid.split("-")
    assert (job, chunk) == (JOB, "000042")
    assert len(nonce) == 8 and int(nonce, 16) >= 0
    assert task_id(JOB, 42) != tid


def test_queued_chunks_reads_this_jobs_messages_only(rclient: redis.Redis, queue: str) -> None:
    push(
        rclient,
        queue,
        celery_message(task_id(JOB, 3)),
        celery_message(task_id(JOB, 7)),
        celery_message(task_id(JOB, 7)),  # a duplicate message
        celery_message(task_id(OTHER, 4)),
        celery_message(f"{JOB}x-000005-abcdef01"),  # a job id that merely starts with ours
        celery_message("a1b2c3d4-e5f6-7890-abcd-ef0123456789"),  # a plain Celery uuid
        celery_message(f"{JOB}-notanumber-abcdef01"),
        b"not json at all",
        b"\xff\xfe binary",
        b"[1, 2, 3]",
        b'"just a string"',
        b"42",
        b"{}",
        b'{"headers": null}',
        b'{"headers": ["id"]}',
        b'{"headers": {"id": null}}',
    )
    assert queued_chunks(rclient, queue, JOB) == {3, 7}
    assert queued_chunks(rclient, queue, OTHER) == {4}
    assert queued_chunks(rclient, queue, "0000000000000000") == set()


def test_queued_chunks_pages_through_long_queues(rclient: redis.Redis, queue: str) -> None:
    push(rclient, queue, *(celery_message(task_id(JOB, c)) for c in range(25)))
    push(rclient, queue, b"garbage")
    for page in (1, 2, 7, 25, 26, 1000):
        assert queued_chunks(rclient, queue, JOB, page=page) == set(range(25))


def test_queued_chunks_of_an_empty_queue(rclient: redis.Redis, queue: str) -> None:
    assert queued_chunks(rclient, queue, JOB) == set()


def test_queued_chunks_sees_messages_published_by_celery(rclient: redis.Redis, queue: str) -> None:
    app = Celery("ut-planner", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=redis_url(rclient), queue=queue))
    try:
        assert publish_chunks(app, JOB, [0, 5, 12], queue=queue) == 3
    finally:
        app.close()
    assert rclient.llen(queue) == 3
    assert queued_chunks(rclient, queue, JOB) == {0, 5, 12}
    assert queued_chunks(rclient, queue, OTHER) == set()


def test_queued_chunks_redis_down_is_retryable() -> None:
    port = free_port()
    client = Bookkeeping.from_url(f"redis://127.0.0.1:{port}/0", "ut-down").client
    with pytest.raises(RetryableError, match="Redis error while reading the broker queue 'q'"):
        queued_chunks(client, "q", JOB)


@pytest.mark.parametrize("chunks", [[4], [0, 1, 2]], ids=["one", "batch"])
def test_publishing_to_a_broker_that_is_down_is_retryable(chunks: list[int]) -> None:
    app = Celery("ut-down", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=f"redis://127.0.0.1:{free_port()}/0", queue="q"))
    app.conf.broker_connection_timeout = 1
    try:
        with pytest.raises(RetryableError, match=r"broker error while publishing chunks \(0 sent\)"):
            publish_chunks(app, JOB, chunks, queue="q")
    finally:
        app.close()


def test_publishing_repair_rounds_to_a_broker_that_is_down_is_retryable() -> None:
    app = Celery("ut-down", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=f"redis://127.0.0.1:{free_port()}/0", queue="q"))
    app.conf.broker_connection_timeout = 1
    try:
        with pytest.raises(RetryableError, match=r"broker error while publishing repair rounds \(0 sent\)"):
            publish_repairs(app, JOB, [RepairUnit(3, 1)], queue="q")
    finally:
        app.close()


# -- plan_job ----------------------------------------------------------------------------------------


def test_plan_excludes_done_running_and_queued_and_replans_expired(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    chunks = 10
    store = store_with_outputs(tmp_path, [0, 3, 12])  # 12 is beyond this job's chunks
    bk.acquire(JOB, 1, "live-worker", 60)  # running
    bk.acquire(JOB, 2, "dead-worker", 0.01)  # its worker died: expired
    bk.acquire(JOB, 3, "finished-worker", 0.01)  # expired, but its output is stored
    bk.acquire(JOB, 8, "dead-worker", 0.01)  # expired, and a message for it is already queued
    bk.acquire(OTHER, 5, "w", 60)  # another job's lease
    time.sleep(0.05)
    push(
        rclient,
        queue,
        celery_message(task_id(JOB, 4)),
        celery_message(task_id(JOB, 8)),
        celery_message(task_id(JOB, 3)),  # a stale message for a done chunk
        celery_message(task_id(OTHER, 6)),
        b"garbage",
        b'{"headers": {}}',
    )
    plan = plan_job(store, bk, queue, JOB, chunks)
    assert plan.chunks == chunks
    assert plan.done == {0, 3}
    assert plan.running == {1}
    assert plan.queued == {4, 8}
    assert plan.to_enqueue == (2, 5, 6, 7, 9)
    assert plan.pending == 8
    # Expired leases were claimed (removed); the live one and the other job's are untouched.
    assert bk.expired_leases(JOB) == []
    assert set(bk.live_leases(JOB)) == {1}
    assert set(bk.live_leases(OTHER)) == {5}
    assert rclient.llen(queue) == 6  # planning reads the queue, never consumes it


def test_plan_buckets_cover_every_chunk(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    chunks = 40
    done = set(range(0, 40, 3))
    running = set(range(1, 40, 4))
    queued = set(range(2, 40, 5))
    store = store_with_outputs(tmp_path, sorted(done))
    for c in running:
        bk.acquire(JOB, c, "w", 60)
    push(rclient, queue, *(celery_message(task_id(JOB, c)) for c in queued))
    plan = plan_job(store, bk, queue, JOB, chunks)
    assert plan.done == done
    assert plan.running == running - done
    assert plan.queued == queued - done - running
    assert set(plan.to_enqueue) == set(range(chunks)) - done - running - queued
    assert list(plan.to_enqueue) == sorted(plan.to_enqueue)
    assert plan.pending == chunks - len(done)


def test_plan_of_a_fresh_job_queues_everything(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    plan = plan_job(LocalStore(tmp_path / "out"), bk, queue, JOB, 5)
    assert plan.to_enqueue == (0, 1, 2, 3, 4)
    assert plan.done == plan.running == plan.queued == frozenset()
    assert plan.pending == 5


def test_plan_of_a_finished_job_queues_nothing(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    store = store_with_outputs(tmp_path, [0, 1, 2])
    bk.acquire(JOB, 1, "late-duplicate", 60)
    plan = plan_job(store, bk, queue, JOB, 3)
    assert plan.to_enqueue == ()
    assert plan.done == {0, 1, 2}
    assert plan.running == frozenset()
    assert plan.pending == 0


def test_replanning_after_publishing_queues_nothing_twice(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    store = store_with_outputs(tmp_path, [1])
    first = plan_job(store, bk, queue, JOB, 4)
    assert first.to_enqueue == (0, 2, 3)
    push(rclient, queue, *(celery_message(task_id(JOB, c)) for c in first.to_enqueue))
    second = plan_job(store, bk, queue, JOB, 4)
    assert second.to_enqueue == ()
    assert second.queued == {0, 2, 3}


def test_dry_run_plan_does_not_touch_redis(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    store = store_with_outputs(tmp_path, [2])
    bk.acquire(JOB, 0, "w", 0.01)
    time.sleep(0.03)
    push(rclient, queue, celery_message(task_id(JOB, 1)))
    plan = plan_job(store, None, queue, JOB, 4)
    assert plan.done == {2}
    assert plan.running == plan.queued == frozenset()
    assert plan.to_enqueue == (0, 1, 3)
    assert bk.expired_leases(JOB) == [0]  # not claimed by a dry run


def test_plan_with_redis_down_is_retryable(tmp_path: Path) -> None:
    port = free_port()
    down = Bookkeeping.from_url(f"redis://127.0.0.1:{port}/0", "ut-down")
    with pytest.raises(RetryableError):
        plan_job(LocalStore(tmp_path), down, "q", JOB, 3)


def unacked(client: redis.Redis, chunk: int, age: float, job: str = JOB) -> None:
    tag = uuid.uuid4().hex
    client.zadd("unacked_index", {tag: time.time() - age})
    client.hset("unacked", tag, json.dumps([{"headers": {"id": task_id(job, chunk)}, "body": ""}, "", "q"]))


def test_plan_counts_deliveries_younger_than_the_lease_as_held(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    rclient.delete("unacked", "unacked_index")
    try:
        unacked(rclient, 1, age=59.5)  # a live worker is about to lease it
        unacked(rclient, 2, age=60.5)  # its worker died: plan it again
        unacked(rclient, 3, age=1, job=OTHER)  # another job's
        store = store_with_outputs(tmp_path, [4])  # chunk 4 == chunks: not this job's
        plan = plan_job(store, bk, queue, JOB, 4)  # the default grace: 60 s, the default lease
        assert plan.queued == {1} and plan.done == frozenset()
        assert plan.to_enqueue == (0, 2, 3)
    finally:
        rclient.delete("unacked", "unacked_index")


def test_plan_without_bookkeeping_is_a_dry_run(tmp_path: Path, bk: Bookkeeping) -> None:
    bk.acquire(JOB, 0, "w", 60)
    plan = plan_job(LocalStore(tmp_path / "out"), None, "q", JOB, 2)
    assert plan.running == frozenset() and plan.to_enqueue == (0, 1)


def test_queue_missing_registers_seeds_done_and_queues_only_what_it_may(
    tmp_path: Path, bk: Bookkeeping, rclient: redis.Redis, queue: str
) -> None:
    store = store_with_outputs(tmp_path, [1])
    bk.acquire(JOB, 2, "live", 60)
    settings = CommonSettings.load(
        {}, broker_url=redis_url(rclient), queue=queue, redis_prefix=bk.prefix, lease_seconds=5
    )
    rclient.delete("unacked", "unacked_index")
    unacked(rclient, 6, age=10)  # stale for a 5 s lease (the settings'), fresh for the 60 s default
    app = Celery("ut-queue-missing", set_as_current=False)
    configure(app, settings)
    try:
        plan, sent = queue_missing(store, bk, app, settings, JOB, 7, "m", only=[0, 3, 4, 5], exclude=[4])
        assert (plan.to_enqueue, sent) == ((0, 3, 4, 5, 6), 3)
        assert queued_chunks(rclient, model_queue(queue, "m"), JOB) == {0, 3, 5}  # the model's queue
        assert bk.job_info(JOB)["output"] == str(tmp_path / "out")  # absolute, for every worker
        assert bk.done_count(JOB) == 1 and bk.job_state(JOB) == ("running", "")
        again, sent = queue_missing(store, bk, app, settings, JOB, 7, "m")
        assert again.queued == {0, 3, 5} and sent == 2  # 4 and 6 now
    finally:
        app.close()
        rclient.delete("unacked", "unacked_index")


def test_registered_location_is_absolute_for_a_folder_and_the_uri_otherwise(tmp_path: Path) -> None:
    class Remote:
        uri = "s3://bucket/prefix"

    relative = LocalStore(os.path.relpath(tmp_path / "out"))
    assert registered_location(relative) == str(tmp_path / "out")
    assert registered_location(Remote()) == "s3://bucket/prefix"  # type: ignore[arg-type]


def test_a_repair_rounds_message_is_never_read_as_its_chunks(
    rclient: redis.Redis, queue: str, bk: Bookkeeping
) -> None:
    from dflash_tasks.coord.planner import repairs_in_flight
    from dflash_tasks.coord.publish import parse_repair_task_id, queued_repairs, repair_task_id
    from dflash_tasks.core.repair import RepairUnit

    tid = repair_task_id(JOB, RepairUnit(34, 2))
    assert tid.startswith(f"{JOB}-000034-r2-") and parse_repair_task_id(tid) == (JOB, 34, 2)
    assert parse_task_id_of(tid) is None and parse_repair_task_id(task_id(JOB, 34)) is None
    push(
        rclient,
        queue,
        celery_message(tid),
        celery_message(task_id(JOB, 5)),
        celery_message(f"{JOB}-000007-x2-abc"),
    )
    assert queued_chunks(rclient, queue, JOB) == {5}  # the planner of chunks does not see the repair
    assert queued_repairs(rclient, queue, JOB) == {(34, 2)}
    bk.acquire(JOB, 9, "w1", 60)  # every chunk is stored: a live lease is a repair round's
    assert repairs_in_flight(bk, queue, JOB) == {9, 34}


def parse_task_id_of(tid: str) -> tuple[str, int] | None:
    from dflash_tasks.coord.publish import parse_task_id

    return parse_task_id(tid)
