"""The consumer switch, the health gate's recovery, and unacked deliveries (countdowns, dead workers)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.publish import task_id, unacked_chunks, unacked_deliveries
from tests.helpers import RedisServer, wait_until
from workers.flow.consumer_switch import ConsumerSwitch
from workers.flow.health import HealthGate

JOB = "0123456789abcdef"


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.calls.append((fn.__name__, args))

    def add_task_queue(self, *args: Any) -> None: ...

    def cancel_task_queue(self, *args: Any) -> None: ...


def test_switch_applies_a_pause_requested_before_the_consumer_exists() -> None:
    switch = ConsumerSwitch(["dflash"])
    switch.pause()
    consumer = FakeConsumer()
    switch.attach(consumer)
    assert consumer.calls == [("cancel_task_queue", ("dflash",))]
    switch.resume()
    assert consumer.calls[-1] == ("add_task_queue", ("dflash", None, "direct", None))


def test_health_gate_is_healthy_again_only_after_consumption_resumed() -> None:
    probe_ok = threading.Event()
    resumes: list[int] = []

    def on_up() -> None:
        resumes.append(1)
        if len(resumes) == 1:
            raise ConnectionError("broker blip")

    gate = HealthGate(probe_ok.is_set, 0.02, on_down=lambda: None, on_up=on_up)
    gate.mark_down("test")
    assert not gate.healthy
    time.sleep(0.1)
    assert not gate.healthy and resumes == []  # still down: no resume attempted
    probe_ok.set()
    wait_until(lambda: gate.healthy, 5, "recovery")
    assert len(resumes) == 2  # the failed resume was retried before declaring health
    gate.stop()


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Any]:
    r = redis_server.client()
    r.delete("unacked", "unacked_index")
    yield r
    r.delete("unacked", "unacked_index")


def deliver(r: Any, chunk: int, age: float, eta_in: float | None = None) -> None:
    tag = uuid.uuid4().hex
    headers: dict[str, Any] = {"id": task_id(JOB, chunk)}
    if eta_in is not None:
        headers["eta"] = (datetime.now(UTC) + timedelta(seconds=eta_in)).isoformat()
    r.zadd("unacked_index", {tag: time.time() - age})
    r.hset("unacked", tag, json.dumps([{"headers": headers, "body": ""}, "", "q"]))


def test_held_chunks_are_fresh_deliveries_and_countdowns(client: Any) -> None:
    deliver(client, 1, age=1)  # just delivered: about to be leased
    deliver(client, 2, age=600)  # old and unleased: its worker died
    deliver(client, 3, age=600, eta_in=300)  # re-queued with a countdown, waiting in a live worker
    deliver(client, 4, age=600, eta_in=-600)  # countdown long past and never started: dead worker
    client.hset("unacked", "garbage", b"not json")
    client.zadd("unacked_index", {"garbage": time.time()})
    assert unacked_chunks(client, JOB, time.time(), grace=60) == {1, 3}
    assert unacked_chunks(client, "ffffffffffffffff", time.time(), grace=60) == set()
    stale = {d.task_id.split("-")[1] for d in unacked_deliveries(client) if d.stale(time.time(), 60)}
    assert stale == {"000002", "000004"}


def test_parking_a_chunk_and_resume_clears_it(redis_server: RedisServer) -> None:
    bk = Bookkeeping.from_url(redis_server.url, f"pk-{uuid.uuid4().hex[:6]}")
    assert [bk.count_chunk_failure(JOB, 7) for _ in range(3)] == [1, 2, 3]
    bk.park_chunk(JOB, 7, "CorruptObject: inputs/chunk-000007.jsonl")
    assert bk.parked(JOB) == {7: "CorruptObject: inputs/chunk-000007.jsonl"}
    bk.resume_job(JOB)
    assert bk.parked(JOB) == {} and bk.count_chunk_failure(JOB, 7) == 1
