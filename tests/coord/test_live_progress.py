"""Tests for dflash_tasks.coord.live_progress against the real Redis (a key prefix per test)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.keys import queue_keys
from dflash_tasks.coord.live_progress import BUCKET_TTL, WORKER_TTL, LiveProgress
from dflash_tasks.core.errors import RetryableError
from tests.helpers import free_port, redis_url

JOB = "0123456789abcdef"
NOW = 1_700_000_000.0
WINDOW = (int(NOW) - 60, int(NOW))


@pytest.fixture
def bk(rclient: redis.Redis, prefix: str) -> Bookkeeping:
    return Bookkeeping.from_url(redis_url(rclient), prefix)


@pytest.fixture
def live(bk: Bookkeeping) -> LiveProgress:
    return LiveProgress.of(bk)


def push_one(live: LiveProgress, worker: str = "gpu0@h", first: float = NOW - 30, **beat: Any) -> None:
    live.push(
        worker,
        buckets={(JOB, WINDOW[0]): {"samples": 2, "tokens": 100, f"{worker}|samples": 2}},
        totals={JOB: {"samples": 2, "tokens": 100, "chunks": 1}},
        first={JOB: first},
        heartbeat={"last_seen": NOW, "inflight": 3, "healthy": "1", **beat},
    )


def test_push_writes_the_documented_keys(live: LiveProgress, rclient: redis.Redis, prefix: str) -> None:
    push_one(live)
    bucket = f"{prefix}:job:{JOB}:rate:{WINDOW[0]}"
    assert rclient.hgetall(bucket) == {b"samples": b"2", b"tokens": b"100", b"gpu0@h|samples": b"2"}
    assert 0 < rclient.ttl(bucket) <= BUCKET_TTL
    per_worker = rclient.hgetall(f"{prefix}:job:{JOB}:workers")
    assert per_worker[b"gpu0@h|samples"] == b"2" and per_worker[b"gpu0@h|chunks"] == b"1"
    assert float(per_worker[b"gpu0@h|first"]) == NOW - 30
    assert float(rclient.hget(f"{prefix}:job:{JOB}", "started_at") or 0) == NOW - 30
    assert rclient.hget(f"{prefix}:worker:gpu0@h", "inflight") == b"3"
    assert 0 < rclient.ttl(f"{prefix}:worker:gpu0@h") <= WORKER_TTL
    assert rclient.sismember(f"{prefix}:workers", "gpu0@h")


def test_pushes_add_up_and_keep_the_earliest_start(live: LiveProgress) -> None:
    push_one(live, first=NOW - 30)
    push_one(live, first=NOW - 10)  # a later chunk start does not move the first one
    push_one(live, first=NOW - 50)
    got = live.read_job(JOB, NOW, WINDOW)
    assert got.per_worker == {
        "gpu0@h": {"samples": "6", "tokens": "300", "chunks": "3", "first": "1699999950.0"}
    }
    assert float(got.job["started_at"]) == NOW - 50
    assert got.buckets == {WINDOW[0]: {"samples": "6", "tokens": "300", "gpu0@h|samples": "6"}}


def test_read_job_gathers_the_job_in_one_pass(
    live: LiveProgress, bk: Bookkeeping, rclient: redis.Redis
) -> None:
    bk.register_job(JOB, "/out")
    bk.complete(JOB, 7, {"samples_ok": 9, "samples_failed": 1})
    bk.acquire(JOB, 1, "gpu0@h", 3600)
    bk.acquire(JOB, 2, "gpu0@h", 1)  # leases are taken in real time: expired a second from now
    push_one(live)
    push_one(live, worker="idle@h")  # in the fleet and the job
    live.push("other@h", {}, {}, {}, {"last_seen": NOW})  # in the fleet only
    queue = f"q-{bk.prefix}"
    rclient.rpush(queue, b"m1", b"m2")
    rclient.rpush(queue_keys(queue)[2], b"m3")  # a priority list
    try:
        got = live.read_job(JOB, time.time() + 1.5, WINDOW, queue)
    finally:
        rclient.delete(*queue_keys(queue))
    assert got.job["output"] == "/out"
    assert got.stats == {"samples_ok": "9", "samples_failed": "1"}
    assert set(got.per_worker) == {"gpu0@h", "idle@h"}
    assert set(got.workers) == {"gpu0@h", "idle@h"} and got.workers["gpu0@h"]["inflight"] == "3"
    assert set(got.fleet) == {"gpu0@h", "idle@h", "other@h"}
    assert got.leased == {1}
    assert got.queue_depth == 3
    assert live.read_job(JOB, NOW, WINDOW).queue_depth is None  # no queue asked for


def test_read_job_leaves_out_empty_buckets_and_expired_leases(live: LiveProgress, bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "a", 60)
    got = live.read_job(JOB, time.time() + 3600, (WINDOW[0] + 3600, WINDOW[1] + 3600))
    assert got.buckets == {} and got.leased == frozenset() and got.per_worker == {}
    assert got.job == {} and got.stats == {} and got.workers == {}


def test_queue_depths_sum_each_queue_over_its_priority_lists(
    live: LiveProgress, rclient: redis.Redis, prefix: str
) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    rclient.rpush(a, b"1")
    rclient.rpush(queue_keys(a)[3], b"2", b"3")
    rclient.rpush(queue_keys(b)[1], b"4")
    try:
        assert live.queue_depths([a, b, f"{prefix}-empty"]) == {a: 3, b: 1, f"{prefix}-empty": 0}
        assert live.queue_depths([]) == {}
    finally:
        rclient.delete(*queue_keys(a), *queue_keys(b))


def test_gpu_clock_is_seeded_then_billed(live: LiveProgress, bk: Bookkeeping) -> None:
    assert not live.has_gpu_clock(JOB)
    live.seed_gpu_clock(JOB, gpu_tick=NOW - 10, started_at=NOW - 100, gpu_seconds=36.0, gpu_hour_usd=2.5)
    assert live.has_gpu_clock(JOB)
    live.seed_gpu_clock(JOB, gpu_tick=NOW, started_at=NOW - 50, gpu_seconds=0.0, gpu_hour_usd=9.0)
    job = bk.job_info(JOB)  # seeding fills in only what is missing; the start only moves earlier
    assert float(job["gpu_tick"]) == NOW - 10 and float(job["started_at"]) == NOW - 100
    assert float(job["gpu_seconds"]) == 36.0 and float(job["gpu_hour_usd"]) == 2.5
    job = live.bill_gpu(JOB, 4.0, NOW, finished=False)
    assert float(job["gpu_seconds"]) == 40.0 and float(job["gpu_tick"]) == NOW and "finished_at" not in job
    job = live.bill_gpu(JOB, 1.0, NOW + 1, finished=True)
    job = live.bill_gpu(JOB, 1.0, NOW + 2, finished=True)
    assert float(job["finished_at"]) == NOW + 1 and float(job["gpu_seconds"]) == 42.0


def test_seeding_nothing_but_the_tick(live: LiveProgress, bk: Bookkeeping) -> None:
    live.seed_gpu_clock(JOB, gpu_tick=NOW)
    assert bk.job_info(JOB) == {"gpu_tick": str(NOW)}


def test_price_and_final_mark(live: LiveProgress, bk: Bookkeeping) -> None:
    live.set_gpu_price(JOB, 3.6)
    live.mark_progress_final(JOB)
    assert bk.job_info(JOB) == {"gpu_hour_usd": "3.6", "progress_final": "1"}


# -- Redis down ------------------------------------------------------------------------------------------


CALLS: dict[str, Callable[[LiveProgress], Any]] = {
    "push": push_one,
    "read_job": lambda lp: lp.read_job(JOB, NOW, WINDOW, "q"),
    "queue_depths": lambda lp: lp.queue_depths(["q"]),
    "has_gpu_clock": lambda lp: lp.has_gpu_clock(JOB),
    "seed_gpu_clock": lambda lp: lp.seed_gpu_clock(JOB, gpu_tick=NOW, started_at=NOW),
    "bill_gpu": lambda lp: lp.bill_gpu(JOB, 1.0, NOW, finished=True),
    "set_gpu_price": lambda lp: lp.set_gpu_price(JOB, 1.0),
    "mark_progress_final": lambda lp: lp.mark_progress_final(JOB),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_redis_down_is_retryable(name: str) -> None:
    port = free_port()  # nothing listens there
    down = LiveProgress.of(Bookkeeping.from_url(f"redis://:hunter2@127.0.0.1:{port}/0", "ut-down"))
    with pytest.raises(RetryableError) as info:
        CALLS[name](down)
    message = str(info.value)
    assert message.startswith("Redis error while ")
    assert str(port) in message
    assert "hunter2" not in message
    assert isinstance(info.value.__cause__, redis.RedisError)
