"""The request pool's in-flight bound: never more running than the target, before and after it moves."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from workers.flow.request_pool import RequestPool


class Gauge:
    """Counts calls running at once and keeps the highest count seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def call(self, hold_s: float) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(hold_s)
        with self._lock:
            self.now -= 1


@pytest.fixture
def pool() -> Iterator[RequestPool]:
    p = RequestPool(3, ceiling=12)  # threads to spare: the bound must come from the target
    yield p
    p.shutdown()


def peak_of(pool: RequestPool, submits: int = 20, hold_s: float = 0.05) -> int:
    gauge = Gauge()
    futures = [pool.submit(gauge.call, hold_s) for _ in range(submits)]
    for future in futures:
        future.result(timeout=10)
    return gauge.peak


def test_twenty_blocking_submits_never_run_more_than_the_target(pool: RequestPool) -> None:
    assert peak_of(pool) == 3


@pytest.mark.parametrize("moved_to", [7, 2])
def test_the_bound_follows_the_target_when_it_moves(pool: RequestPool, moved_to: int) -> None:
    assert peak_of(pool) == 3
    assert pool.set_target(moved_to) == moved_to
    assert peak_of(pool) == moved_to


def test_lowering_the_target_while_requests_run_starts_none_until_under_it(pool: RequestPool) -> None:
    release = threading.Event()
    gauge = Gauge()
    held = [pool.submit(release.wait, 10) for _ in range(3)]
    queued = [pool.submit(gauge.call, 0.02) for _ in range(10)]
    pool.set_target(1)
    time.sleep(0.1)
    assert pool.running == 3 and pool.waiting == 10  # the three keep running, nothing new starts
    release.set()
    for future in held + queued:
        future.result(timeout=10)
    assert gauge.peak == 1


def test_a_target_is_clamped_to_one_and_the_ceiling(pool: RequestPool) -> None:
    assert pool.set_target(0) == 1
    assert pool.set_target(500) == 12
    assert peak_of(pool, submits=30) == 12
