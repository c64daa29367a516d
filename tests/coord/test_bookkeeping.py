"""Tests for dflash_tasks.coord.bookkeeping against the real Redis (a key prefix per test)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.errors import RetryableError
from tests.helpers import free_port, redis_url

JOB = "0123456789abcdef"


@pytest.fixture
def bk(rclient: redis.Redis, prefix: str) -> Bookkeeping:
    return Bookkeeping.from_url(redis_url(rclient), prefix)


# -- leases --------------------------------------------------------------------------------------------


def test_acquire_refuses_another_owner_while_live(bk: Bookkeeping) -> None:
    assert bk.acquire(JOB, 3, "worker-a", 60)
    assert not bk.acquire(JOB, 3, "worker-b", 60)
    assert bk.owners(JOB) == {3: "worker-a"}
    assert bk.acquire(JOB, 4, "worker-b", 60)  # other chunks are free
    assert bk.owners(JOB) == {3: "worker-a", 4: "worker-b"}


def test_same_owner_can_re_acquire_and_extend(bk: Bookkeeping) -> None:
    assert bk.acquire(JOB, 1, "a", 10)
    first = bk.live_leases(JOB)[1]
    assert bk.acquire(JOB, 1, "a", 100)
    assert bk.live_leases(JOB)[1] > first + 50


def test_another_owner_takes_over_after_expiry(bk: Bookkeeping) -> None:
    assert bk.acquire(JOB, 1, "a", 0.1)
    assert not bk.acquire(JOB, 1, "b", 60)
    time.sleep(0.15)
    assert bk.acquire(JOB, 1, "b", 60)
    assert bk.owners(JOB) == {1: "b"}
    assert not bk.acquire(JOB, 1, "a", 60)


def test_lease_expiry_is_now_plus_lease_seconds(bk: Bookkeeping) -> None:
    before = time.time()
    bk.acquire(JOB, 0, "a", 30)
    after = time.time()
    expiry = bk.live_leases(JOB)[0]
    assert before + 30 <= expiry <= after + 30


def test_documented_key_layout(bk: Bookkeeping, rclient: redis.Redis, prefix: str) -> None:
    bk.register_job(JOB, "/out")
    bk.acquire(JOB, 5, "a", 60)
    bk.complete(JOB, 6, {"samples_ok": 1})
    assert rclient.sismember(f"{prefix}:jobs", JOB)
    assert rclient.hget(f"{prefix}:job:{JOB}", "output") == b"/out"
    assert rclient.zscore(f"{prefix}:job:{JOB}:leases", "5") is not None
    assert rclient.hget(f"{prefix}:job:{JOB}:owners", "5") == b"a"
    assert rclient.sismember(f"{prefix}:job:{JOB}:done", "6")
    assert rclient.hget(f"{prefix}:job:{JOB}:stats", "samples_ok") == b"1"


def test_renew_extends_live_leases(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "a", 5)
    bk.acquire(JOB, 2, "a", 5)
    old = bk.live_leases(JOB)
    bk.renew([(JOB, 1, "a"), (JOB, 2, "a")], 500)
    new = bk.live_leases(JOB)
    assert set(new) == {1, 2}
    assert all(new[c] > old[c] + 400 for c in (1, 2))


def test_renew_re_creates_lost_leases(bk: Bookkeeping, rclient: redis.Redis, prefix: str) -> None:
    other_job = "fedcba9876543210"
    bk.acquire(JOB, 1, "a", 60)
    rclient.delete(f"{prefix}:job:{JOB}:leases", f"{prefix}:job:{JOB}:owners")  # Redis lost them
    assert bk.live_leases(JOB) == {}
    bk.renew([(JOB, 1, "a"), (other_job, 7, "b")], 60)
    assert set(bk.live_leases(JOB)) == {1}
    assert bk.owners(JOB) == {1: "a"}
    assert set(bk.live_leases(other_job)) == {7}
    assert bk.owners(other_job) == {7: "b"}
    assert not bk.acquire(JOB, 1, "intruder", 60)


def test_renew_of_nothing_is_a_no_op(bk: Bookkeeping) -> None:
    bk.renew([], 60)
    assert bk.live_leases(JOB) == {}


def test_release_only_by_owner(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 2, "a", 60)
    bk.release(JOB, 2, "b")
    assert set(bk.live_leases(JOB)) == {2}
    assert bk.owners(JOB) == {2: "a"}
    bk.release(JOB, 2, "a")
    assert bk.live_leases(JOB) == {}
    assert bk.owners(JOB) == {}
    assert bk.acquire(JOB, 2, "b", 60)


def test_release_of_an_unknown_lease_is_harmless(bk: Bookkeeping) -> None:
    bk.release(JOB, 9, "a")
    assert bk.live_leases(JOB) == {}


def test_live_and_expired_leases(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "a", 10)
    bk.acquire(JOB, 2, "a", 100)
    bk.acquire(JOB, 3, "b", 1000)
    now = time.time()
    assert set(bk.live_leases(JOB)) == {1, 2, 3}
    assert bk.expired_leases(JOB) == []
    later = now + 50  # chunk 1's worker stopped renewing 50 s ago
    assert set(bk.live_leases(JOB, now=later)) == {2, 3}
    assert bk.expired_leases(JOB, now=later) == [1]
    much_later = now + 500
    assert set(bk.live_leases(JOB, now=much_later)) == {3}
    assert sorted(bk.expired_leases(JOB, now=much_later)) == [1, 2]
    assert bk.live_leases("other-job") == {}


def test_expired_lease_seen_without_a_clock_override(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 4, "a", 0.05)
    time.sleep(0.1)
    assert bk.expired_leases(JOB) == [4]
    assert bk.live_leases(JOB) == {}


def test_claim_expired_returns_true_exactly_once(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "a", 0.05)
    time.sleep(0.1)
    assert bk.claim_expired(JOB, 1)
    assert not bk.claim_expired(JOB, 1)
    assert bk.expired_leases(JOB) == []
    assert bk.owners(JOB) == {}


def test_claim_expired_concurrent_reconcilers(bk: Bookkeeping, rclient: redis.Redis, prefix: str) -> None:
    for chunk in range(20):
        bk.acquire(JOB, chunk, "dead", 0.01)
    time.sleep(0.05)
    wins: list[tuple[int, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def reconciler(n: int) -> None:
        mine = Bookkeeping.from_url(redis_url(rclient), prefix)
        barrier.wait()
        for chunk in range(20):
            if mine.claim_expired(JOB, chunk):
                with lock:
                    wins.append((chunk, n))

    threads = [threading.Thread(target=reconciler, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(c for c, _ in wins) == list(range(20))


def test_claim_expired_leaves_a_renewed_lease_alone(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "a", 0.05)
    time.sleep(0.1)
    assert bk.expired_leases(JOB) == [1]  # the reconciler sees it expired ...
    bk.renew([(JOB, 1, "a")], 60)  # ... then the slow worker's heartbeat lands
    assert not bk.claim_expired(JOB, 1)
    assert set(bk.live_leases(JOB)) == {1}
    assert bk.owners(JOB) == {1: "a"}


# -- completion, done markers and counters ---------------------------------------------------------


def test_complete_counts_once_per_chunk(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 5, "a", 60)
    counters = {"samples_ok": 60, "samples_failed": 4, "completion_tokens": 123456, "chunk_seconds": 1.25}
    assert bk.complete(JOB, 5, counters)
    assert bk.live_leases(JOB) == {}
    assert bk.owners(JOB) == {}
    assert bk.done_count(JOB) == 1
    assert bk.stats(JOB) == counters
    # A duplicate delivery of the same chunk finishing later moves nothing.
    bk.acquire(JOB, 5, "b", 60)
    assert not bk.complete(JOB, 5, counters)
    assert bk.stats(JOB) == counters
    assert bk.done_count(JOB) == 1
    assert bk.live_leases(JOB) == {}  # but its lease is still cleared
    # Another chunk adds up.
    assert bk.complete(JOB, 6, {"samples_ok": 64, "completion_tokens": 1000.5})
    stats = bk.stats(JOB)
    assert stats["samples_ok"] == 124
    assert stats["completion_tokens"] == pytest.approx(124456.5)
    assert stats["samples_failed"] == 4
    assert bk.done_count(JOB) == 2


def test_complete_without_counters(bk: Bookkeeping) -> None:
    assert bk.complete(JOB, 0, {})
    assert not bk.complete(JOB, 0, {})
    assert bk.stats(JOB) == {}
    assert bk.done_count(JOB) == 1


def test_concurrent_completions_of_one_chunk_count_once(
    bk: Bookkeeping, rclient: redis.Redis, prefix: str
) -> None:
    results: list[bool] = []
    barrier = threading.Barrier(5)

    def finish() -> None:
        mine = Bookkeeping.from_url(redis_url(rclient), prefix)
        barrier.wait()
        results.append(mine.complete(JOB, 9, {"samples_ok": 64}))

    threads = [threading.Thread(target=finish) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [False, False, False, False, True]
    assert bk.stats(JOB) == {"samples_ok": 64.0}


def test_mark_done_and_done_count(bk: Bookkeeping) -> None:
    assert bk.done_count(JOB) == 0
    bk.mark_done(JOB, [0, 1, 2])
    bk.mark_done(JOB, [2, 3])
    bk.mark_done(JOB, [])
    assert bk.done_count(JOB) == 4
    bk.mark_done(JOB, range(100, 25_100))  # more than one batch
    assert bk.done_count(JOB) == 25_004
    # A chunk seeded as done does not count again when a late worker completes it.
    assert not bk.complete(JOB, 2, {"samples_ok": 64})
    assert bk.stats(JOB) == {}


# -- job registry ------------------------------------------------------------------------------------


def test_register_job_info_and_jobs(bk: Bookkeeping) -> None:
    assert bk.jobs() == []
    assert bk.job_info(JOB) == {}
    before = time.time()
    bk.register_job(JOB, "/data/out")
    bk.register_job("00000000000000aa", "/data/other")
    assert bk.jobs() == ["00000000000000aa", JOB]
    info = bk.job_info(JOB)
    assert info["output"] == "/data/out"
    assert info["state"] == "running"
    assert before <= float(info["registered"]) <= time.time()


def test_re_register_updates_output_but_keeps_state(
    bk: Bookkeeping, rclient: redis.Redis, prefix: str
) -> None:
    bk.register_job(JOB, "/old")
    rclient.hset(f"{prefix}:job:{JOB}", mapping={"state": "paused", "reason": "server down"})
    bk.register_job(JOB, "/new")
    info = bk.job_info(JOB)
    assert info["output"] == "/new"
    assert info["state"] == "paused"
    assert info["reason"] == "server down"
    assert bk.jobs() == [JOB]


def test_finish_job_unregisters(bk: Bookkeeping) -> None:
    bk.register_job(JOB, "/out")
    bk.finish_job(JOB)
    assert bk.jobs() == []
    bk.finish_job(JOB)  # idempotent


def test_try_lock(bk: Bookkeeping) -> None:
    assert bk.try_lock("reconcile", "a", 0.1)
    assert not bk.try_lock("reconcile", "b", 0.1)
    assert bk.try_lock("other", "b", 0.1)
    time.sleep(0.15)
    assert bk.try_lock("reconcile", "b", 10)


def test_ping_reaches_redis(bk: Bookkeeping) -> None:
    bk.ping()
    bk.client.connection_pool.disconnect()
    with pytest.raises(RetryableError, match="connecting to the broker"):
        Bookkeeping.from_url(f"redis://127.0.0.1:{free_port()}/0").ping()


# -- Redis down ------------------------------------------------------------------------------------------


CALLS: dict[str, Callable[[Bookkeeping], Any]] = {
    "ping": lambda b: b.ping(),
    "register_job": lambda b: b.register_job(JOB, "/out"),
    "job_info": lambda b: b.job_info(JOB),
    "jobs": lambda b: b.jobs(),
    "finish_job": lambda b: b.finish_job(JOB),
    "acquire": lambda b: b.acquire(JOB, 1, "a", 60),
    "renew": lambda b: b.renew([(JOB, 1, "a")], 60),
    "release": lambda b: b.release(JOB, 1, "a"),
    "complete": lambda b: b.complete(JOB, 1, {"samples_ok": 1}),
    "live_leases": lambda b: b.live_leases(JOB),
    "expired_leases": lambda b: b.expired_leases(JOB),
    "claim_expired": lambda b: b.claim_expired(JOB, 1),
    "owners": lambda b: b.owners(JOB),
    "mark_done": lambda b: b.mark_done(JOB, [1, 2]),
    "done_count": lambda b: b.done_count(JOB),
    "stats": lambda b: b.stats(JOB),
    "try_lock": lambda b: b.try_lock("x", "a", 1),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_redis_down_is_retryable(name: str) -> None:
    port = free_port()  # nothing listens there
    down = Bookkeeping.from_url(f"redis://:hunter2@127.0.0.1:{port}/0", "ut-down")
    with pytest.raises(RetryableError) as info:
        CALLS[name](down)
    message = str(info.value)
    assert message.startswith("Redis error while ")
    assert str(port) in message
    assert "hunter2" not in message
