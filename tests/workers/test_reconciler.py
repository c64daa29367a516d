"""The reconciler against a real Redis: expired leases and deliveries to workers that died."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.publish import task_id
from dflash_tasks.core.job import output_key
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer, free_port, wait_until
from workers.monitor.listener import NO_LISTENER
from workers.recovery.events import RecoveryEvent, emit, parse_events
from workers.recovery.leases import LeaseKeeper, Reconciler

JOB = "0123456789abcdef"


@pytest.fixture
def bk(redis_server: RedisServer) -> Iterator[Bookkeeping]:
    book = Bookkeeping.from_url(redis_server.url, f"rt-{uuid.uuid4().hex[:6]}")
    book.client.delete("unacked", "unacked_index")
    yield book
    book.client.delete("unacked", "unacked_index")


def deliver(bk: Bookkeeping, chunk: int, age: float) -> str:
    """Fake kombu's bookkeeping of a message delivered ``age`` seconds ago and not acked."""
    tag = uuid.uuid4().hex
    payload = {"headers": {"id": task_id(JOB, chunk), "task": "dflash.run_chunk"}, "body": "..."}
    bk.client.zadd("unacked_index", {tag: time.time() - age})
    bk.client.hset("unacked", tag, json.dumps([payload, "", "dflash"]))
    return tag


def reconciler(bk: Bookkeeping, store: LocalStore, calls: list[tuple[str, int]]) -> Reconciler:
    return Reconciler(
        bk, lambda _job: store, lambda j, c: calls.append((j, c)), owner="w", interval=0.01, lease_seconds=5
    )


def test_rescues_old_unleased_deliveries_once(bk: Bookkeeping, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write(output_key(3), b"{}\n")
    bk.register_job(JOB, str(tmp_path))
    deliver(bk, 1, age=60)  # dead worker: old, no lease -> rescued
    deliver(bk, 2, age=1)  # just delivered: the worker is about to lease it
    deliver(bk, 3, age=60)  # already done
    deliver(bk, 4, age=60)  # leased by a live worker
    bk.acquire(JOB, 4, "alive", 60)
    calls: list[tuple[str, int]] = []
    rec = reconciler(bk, store, calls)
    assert rec.run_once() == [(JOB, 1)] and calls == [(JOB, 1)]
    time.sleep(0.02)
    bk.client.delete(f"{bk._p}:lock:reconcile")  # let a second pass run now
    assert rec.run_once() == [] and calls == [(JOB, 1)]  # never re-queued twice for one delivery


def test_requeues_expired_leases_but_not_renewed_or_done_ones(bk: Bookkeeping, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write(output_key(7), b"{}\n")
    bk.register_job(JOB, str(tmp_path))
    bk.acquire(JOB, 5, "dead", 0.01)
    bk.acquire(JOB, 6, "alive", 60)
    bk.acquire(JOB, 7, "finished-but-lost-release", 0.01)
    time.sleep(0.05)
    calls: list[tuple[str, int]] = []
    assert reconciler(bk, store, calls).run_once() == [(JOB, 5)]
    assert set(bk.live_leases(JOB)) == {6}


def test_one_broken_job_does_not_stop_the_others(bk: Bookkeeping, tmp_path: Path) -> None:
    from dflash_tasks.core.errors import StoreError

    store = LocalStore(tmp_path)
    bk.register_job(JOB, str(tmp_path))
    bk.register_job("broken000000000", "/nonexistent")
    for job in (JOB, "broken000000000"):
        bk.acquire(job, 1, "dead", 0.01)
    time.sleep(0.05)

    def open_store(job: str) -> LocalStore:
        if job != JOB:
            raise StoreError("gone")
        return store

    calls: list[tuple[str, int]] = []
    rec = Reconciler(bk, open_store, lambda j, c: calls.append((j, c)), owner="w", interval=0.01)
    assert rec.run_once() == [(JOB, 1)]


def test_periodic_replan_is_the_backstop_for_lost_messages(bk: Bookkeeping, tmp_path: Path) -> None:
    bk.register_job(JOB, str(tmp_path))
    asked: list[str] = []

    def replan(job: str) -> list[int]:
        asked.append(job)
        return [4]  # a chunk whose message vanished between the queue and the unacked set

    def every(seconds: float) -> Reconciler:
        return Reconciler(
            bk,
            lambda _j: LocalStore(tmp_path),
            lambda j, c: None,
            owner="w",
            interval=0.01,
            replan=replan,
            replan_seconds=seconds,
        )

    assert every(0.0).run_once() == [(JOB, 4)] and asked == [JOB]
    bk.client.delete(f"{bk._p}:lock:reconcile")
    assert every(3600.0).run_once() == [] and asked == [JOB]  # not due yet


def test_a_dead_workers_leased_chunk_is_queued_once_not_also_rescued(bk: Bookkeeping, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    bk.register_job(JOB, str(tmp_path))
    deliver(bk, 2, age=60)  # the dead worker's delivery of the chunk it had leased
    deliver(bk, 8, age=30)  # and one it had not leased yet
    bk.acquire(JOB, 2, "dead", 0.01)
    time.sleep(0.05)
    calls: list[tuple[str, int]] = []
    rec = reconciler(bk, store, calls)
    assert rec.run_once() == [(JOB, 2), (JOB, 8)] and calls == [(JOB, 2), (JOB, 8)]
    bk.client.delete(f"{bk._p}:lock:reconcile")
    assert rec.run_once() == [] and len(calls) == 2  # the new messages still wait: not rescued


def test_each_path_logs_a_recovery_event_naming_it(
    bk: Bookkeeping, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalStore(tmp_path)
    bk.register_job(JOB, str(tmp_path))
    bk.acquire(JOB, 5, "dead", 0.01)  # lease expired
    deliver(bk, 1, age=60)  # delivered to a dead worker, never leased
    time.sleep(0.05)
    rec = Reconciler(
        bk,
        lambda _j: store,
        lambda j, c: None,
        owner="w",
        interval=0.01,
        lease_seconds=5,
        replan=lambda job: [4],
        replan_seconds=0.0,
    )
    with caplog.at_level("WARNING", logger="workers.recovery.leases"):
        assert sorted(rec.run_once()) == [(JOB, 1), (JOB, 4), (JOB, 5)]
    assert parse_events(caplog.text) == [
        RecoveryEvent("lease_expired", JOB, 5),
        RecoveryEvent("unleased_delivery", JOB, 1),
        RecoveryEvent("replan", JOB, 4),
    ]
    assert "re-queued chunk 5 of job 0123456789abcdef: its lease expired (worker lost)" in caplog.text


def test_recovery_events_survive_a_cut_line_and_reject_unknown_mechanisms() -> None:
    import logging

    whole = '{"event": "recovery", "mechanism": "replan", "job": "j", "chunk": 2}'
    text = f"x {whole}\ny {whole[:30]}"  # the second line was cut short by a kill
    assert parse_events(text) == [RecoveryEvent("replan", "j", 2)]
    with pytest.raises(ValueError, match="unknown recovery mechanism 'guess'"):
        emit(logging.getLogger("t"), NO_LISTENER, "guess", JOB, 1, "why")


def stores(tmp_path: Path, *jobs: str) -> dict[str, LocalStore]:
    return {job: LocalStore(tmp_path / job) for job in jobs}


def test_every_jobs_expired_leases_are_requeued_in_one_pass(bk: Bookkeeping, tmp_path: Path) -> None:
    other = "fedcba9876543210"
    by_job = stores(tmp_path, JOB, other)
    for job in (JOB, other):
        bk.register_job(job, str(tmp_path / job))
        bk.acquire(job, 3, "dead", 0.01)
    time.sleep(0.05)
    calls: list[tuple[str, int]] = []
    rec = Reconciler(bk, by_job.__getitem__, lambda j, c: calls.append((j, c)), owner="w", interval=0.01)
    assert sorted(rec.run_once()) == sorted(calls) == [(JOB, 3), (other, 3)]


def test_the_pass_lock_lasts_most_of_an_interval(bk: Bookkeeping, tmp_path: Path) -> None:
    bk.register_job(JOB, str(tmp_path))
    rec = Reconciler(bk, lambda _j: LocalStore(tmp_path), lambda j, c: None, owner="w", interval=2.0)
    rec.run_once()
    ttl = bk.client.pttl(f"{bk.prefix}:lock:reconcile")
    assert 1000 < ttl <= 1600  # 0.8 x the interval: the next pass (any worker's) finds it free
    other = Reconciler(bk, lambda _j: LocalStore(tmp_path), lambda j, c: None, owner="v", interval=0.01)
    bk.acquire(JOB, 1, "dead", 0.01)
    time.sleep(0.05)
    assert other.run_once() == []  # locked out: one pass at a time
    bk.client.delete(f"{bk.prefix}:lock:reconcile")
    short = Reconciler(bk, lambda _j: LocalStore(tmp_path), lambda j, c: None, owner="u", interval=0.01)
    short.run_once()
    assert 900 < bk.client.pttl(f"{bk.prefix}:lock:reconcile") <= 1000  # at least a second


def test_replan_runs_every_time_it_is_due_and_one_failing_job_does_not_stop_it(
    bk: Bookkeeping, tmp_path: Path
) -> None:
    from dflash_tasks.core.errors import StoreError

    broken, third = "00000000000000bb", "ffffffffffffff03"
    for job in (broken, JOB, third):
        bk.register_job(job, str(tmp_path))

    def replan(job: str) -> list[int]:
        if job == broken:
            raise StoreError("gone")
        return [1, 2] if job == JOB else [5]

    rec = Reconciler(
        bk,
        lambda _j: LocalStore(tmp_path),
        lambda j, c: None,
        owner="w",
        interval=0.01,
        replan=replan,
        replan_seconds=0.0,
    )
    for _ in range(2):
        bk.client.delete(f"{bk.prefix}:lock:reconcile")
        assert rec.run_once() == [(JOB, 1), (JOB, 2), (third, 5)]


def test_rescue_goes_past_deliveries_it_must_leave_alone(
    bk: Bookkeeping, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Oldest first: a foreign message, another job's, a done chunk, a leased one, one already
    rescued and one whose job store fails all come before the one to rescue."""
    from dflash_tasks.core.errors import StoreError

    failing = "00000000000000ff"
    by_job = stores(tmp_path, JOB)
    for job in (JOB, failing):
        bk.register_job(job, str(tmp_path / job))
    by_job[JOB].write(output_key(3), b"{}\n")
    bk.acquire(JOB, 4, "alive", 60)

    def open_store(job: str) -> LocalStore:
        if job == failing:
            raise StoreError("bucket gone")
        return by_job[job]

    def raw(task: str, age: float) -> None:
        tag = uuid.uuid4().hex
        payload = {"headers": {"id": task}, "body": ""}
        bk.client.zadd("unacked_index", {tag: time.time() - age})
        bk.client.hset("unacked", tag, json.dumps([payload, "", "q"]))

    raw("a1b2c3d4-e5f6-7890-abcd-ef0123456789", 90)  # not ours
    raw(task_id("fedcba9876543210", 1), 89)  # a job not registered
    deliver(bk, 3, age=88)  # done
    deliver(bk, 4, age=87)  # leased by a live worker
    tag = deliver(bk, 5, age=86)
    bk.try_lock(f"rescued:{tag}", "earlier-pass", 60)  # rescued before
    raw(task_id(failing, 2), 85)
    deliver(bk, 6, age=30)  # the one to rescue
    calls: list[tuple[str, int]] = []
    rec = Reconciler(
        bk, open_store, lambda j, c: calls.append((j, c)), owner="w", interval=0.01, lease_seconds=5
    )
    with caplog.at_level("WARNING", logger="workers.recovery.leases"):
        assert rec.run_once() == [(JOB, 6)] and calls == [(JOB, 6)]
    assert f"rescuing chunk 2 of job {failing} failed: bucket gone" in caplog.text


def test_lease_keeper_renews_what_it_holds_and_lets_go(bk: Bookkeeping) -> None:
    bk.acquire(JOB, 1, "me", 0.5)
    bk.acquire(JOB, 2, "me", 0.5)
    keeper = LeaseKeeper(bk, lease_seconds=60, heartbeat_seconds=0.05)
    keeper.hold(JOB, 1, "me")
    keeper.hold(JOB, 2, "me")
    keeper.drop(JOB, 2)
    keeper.drop(JOB, 9)  # not held: nothing happens
    assert keeper.held() == [(JOB, 1, "me")]
    keeper.renew_now()
    expiry = bk.live_leases(JOB)
    assert expiry[1] > time.time() + 50 and expiry[2] < time.time() + 1  # only the held one
    assert bk.owners(JOB)[1] == "me"
    bk.acquire(JOB, 1, "me", 0.5)  # back to a short lease: the thread must renew it
    keeper.start()
    try:
        wait_until(lambda: bk.live_leases(JOB).get(1, 0) > time.time() + 50, 5, "a heartbeat")
    finally:
        keeper.stop()


def test_lease_keeper_outlives_a_broken_redis(caplog: pytest.LogCaptureFixture) -> None:
    down = Bookkeeping.from_url(f"redis://127.0.0.1:{free_port()}/0", "down")
    keeper = LeaseKeeper(down, lease_seconds=60, heartbeat_seconds=0.02)
    keeper.hold(JOB, 1, "me")
    with caplog.at_level("WARNING", logger="workers.recovery.leases"):
        keeper.start()
        try:
            wait_until(lambda: caplog.text.count("lease heartbeat failed") >= 2, 10, "two failed beats")
        finally:
            keeper.stop()


def test_the_reconciler_thread_runs_passes_until_stopped(bk: Bookkeeping, tmp_path: Path) -> None:
    bk.register_job(JOB, str(tmp_path))
    calls: list[tuple[str, int]] = []
    rec = Reconciler(
        bk, lambda _j: LocalStore(tmp_path), lambda j, c: calls.append((j, c)), owner="w", interval=0.02
    )
    rec.start()
    try:
        bk.acquire(JOB, 7, "dead", 0.01)
        wait_until(lambda: calls == [(JOB, 7)], 5, "the reconciler thread to re-queue chunk 7")
    finally:
        rec.stop()


class _SlowRenewal:
    """The bookkeeping, with each renewal taking ``delay`` seconds before it reaches Redis."""

    def __init__(self, bk: Bookkeeping, delay: float) -> None:
        self.bk, self.delay = bk, delay

    def renew(self, leases: list[tuple[str, int, str]], lease_seconds: float) -> None:
        time.sleep(self.delay)
        self.bk.renew(leases, lease_seconds)


def test_a_lease_given_back_is_not_recreated_by_a_renewal_in_flight(bk: Bookkeeping) -> None:

    assert bk.acquire("j", 0, "w@h/t1", 30)
    keeper = LeaseKeeper(_SlowRenewal(bk, 0.4), lease_seconds=30, heartbeat_seconds=60)  # type: ignore[arg-type]
    keeper.hold("j", 0, "w@h/t1")
    beat = threading.Thread(target=keeper.renew_now)
    beat.start()
    time.sleep(0.1)  # the renewal is under way
    keeper.drop("j", 0)  # as a chunk does before completing: waits for the renewal in flight
    bk.release("j", 0, "w@h/t1")
    beat.join()
    assert bk.owners("j") == {}  # the renewal did not bring the released lease back
