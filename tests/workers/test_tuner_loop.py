"""The tuner's loop against a real request pool and a scripted server load (no server, no broker)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from dflash_tasks.core.record import Record
from dflash_tasks.core.spec_stats import SampleCounts, sample_counts
from dflash_tasks.core.tuner_state import TunerState
from workers.flow.inflight_tuner import InflightTuner, Phase
from workers.flow.request_pool import RequestPool
from workers.flow.tuner_inputs import TunerConfig, Window
from workers.flow.tuner_loop import TunerLoop
from workers.sglang_client import ServerLoad


@pytest.fixture
def pool() -> Iterator[RequestPool]:
    p = RequestPool(48, ceiling=128)
    yield p
    p.shutdown()


def hold(pool: RequestPool, n: int) -> threading.Event:
    """Keep ``n`` requests running in the pool until the returned event is set."""
    release = threading.Event()
    for _ in range(n):
        pool.submit(release.wait, 10)
    return release


def test_a_window_at_a_full_target_is_measured_from_the_servers_gauges(pool: RequestPool) -> None:
    loads = iter(
        [ServerLoad(running=40, queued=2, gen_throughput=1000, token_usage=0.3)] * 2
        + [ServerLoad(running=44, queued=0, gen_throughput=1400, token_usage=0.5)] * 1000
    )
    loop = TunerLoop(
        InflightTuner(TunerConfig()), pool, lambda: next(loads), window_seconds=0.3, sample_seconds=0.02
    )
    release = hold(pool, 48)
    try:
        window = loop.measure()
    finally:
        release.set()
    assert window is not None
    assert window.target == 48
    assert 1000 < window.tokens_per_s < 1400  # the mean of the samples, not the last one
    assert 40 < window.running < 44
    assert window.token_usage == 0.5  # the highest KV use seen


def test_a_window_in_which_many_requests_finished_is_measured_by_the_completed_tokens(
    pool: RequestPool,
) -> None:
    loop = TunerLoop(
        InflightTuner(TunerConfig()),
        pool,
        lambda: ServerLoad(running=48, gen_throughput=900),
        window_seconds=0.4,
        sample_seconds=0.02,
    )
    counts = SampleCounts(
        ok=True, completion_tokens=35, prompt_tokens=100, spec_tokens=0, verify=0, turns=1, generations=1
    )
    stop = threading.Event()

    def finish(per_batch: int) -> None:  # requests finishing while the window runs
        while not stop.wait(0.01):
            for _ in range(per_batch):
                loop.sample_done("job", counts)

    release = hold(pool, 48)
    few = threading.Thread(target=finish, args=(1,))
    few.start()
    try:
        slow = loop.measure()  # about 20 finished: under 4 per slot, the gauge decides
        stop.set()
        few.join()
        stop.clear()
        many = threading.Thread(target=finish, args=(40,))
        many.start()
        fast = loop.measure()  # about 1,600: the count decides
    finally:
        stop.set()
        release.set()
    many.join()
    assert slow is not None and slow.tokens_per_s == pytest.approx(900)
    assert fast is not None and fast.tokens_per_s == pytest.approx(fast.completed_tokens_per_s)
    assert fast.completed_tokens_per_s > 4 * 48 * 35 / 0.5


def test_a_window_short_of_work_says_nothing_about_the_target(pool: RequestPool) -> None:
    loop = TunerLoop(
        InflightTuner(TunerConfig()),
        pool,
        lambda: ServerLoad(running=10, gen_throughput=900),
        window_seconds=0.2,
        sample_seconds=0.02,
    )
    release = hold(pool, 10)  # 10 of 48: the job is draining
    try:
        assert loop.measure() is None
    finally:
        release.set()


def test_applying_a_window_moves_the_pool_reports_the_change_and_logs_every_window(
    pool: RequestPool, caplog: pytest.LogCaptureFixture
) -> None:
    changes: list[TunerState] = []
    loop = TunerLoop(InflightTuner(TunerConfig()), pool, ServerLoad, on_change=changes.append)
    caplog.set_level(logging.DEBUG, logger="workers.flow.tuner_loop")

    assert loop.apply(Window(target=48, seconds=30, tokens_per_s=1000, running=48)) == 72
    assert pool.max_inflight == 72
    assert changes[-1].target == 72 and changes[-1].phase == Phase.CLIMB.value
    assert changes[-1].to_dict()["curve"] == [
        {"target": 48, "tokens_per_s": 1000.0, "accept_length": 0.0, "token_usage": 0.0, "windows": 1}
    ]
    # the same target again (a stale window): no change, no report, but the window is logged
    assert loop.apply(Window(target=48, seconds=30, tokens_per_s=5000)) == 72
    assert len(changes) == 1
    windows = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    moves = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(windows) == 2 and windows[0].startswith("in-flight tuner window: 48 at 1000 tok/s")
    assert moves == [
        "in-flight tuner: 48 -> 72 (climbing: throughput rising); "
        "48 at 1000 tok/s, running 48, queued 0, KV 0.00"
    ]


def test_the_first_window_and_the_first_after_a_refill_are_fresh(pool: RequestPool) -> None:
    loop = TunerLoop(
        InflightTuner(TunerConfig()),
        pool,
        lambda: ServerLoad(running=17, queued=9, gen_throughput=900),
        window_seconds=0.2,
        sample_seconds=0.02,
    )
    release = hold(pool, 48)
    try:
        first, second = loop.measure(), loop.measure()
    finally:
        release.set()
    assert first is not None and first.fresh
    assert second is not None and not second.fresh
    release = hold(pool, 10)  # a chunk's drain: nothing to learn, and the pool refills after it
    try:
        assert loop.measure() is None
    finally:
        release.set()
    release = hold(pool, 48)
    try:
        refilled = loop.measure()
    finally:
        release.set()
    assert refilled is not None and refilled.fresh


def test_the_servers_running_cap_reaches_the_tuner(pool: RequestPool) -> None:
    loop = TunerLoop(InflightTuner(TunerConfig()), pool, lambda: ServerLoad(), running_cap=lambda: 256)
    loop._learn_running_cap()
    assert loop.tuner.config.server_running_cap == 256


def test_a_window_carries_the_retractions_of_its_samples_and_of_the_server(pool: RequestPool) -> None:
    # a sample whose two turns were retracted 2 and 1 times (meta_info), finished inside the window
    turns = [
        {"status": "ok", "usage": {"completion_tokens": 10}, "meta_info": {"num_retractions": n}}
        for n in (2, 1)
    ]
    retracted = sample_counts(Record.from_dict({"id": "r", "status": "ok", "user_turns": 2, "turns": turns}))
    assert retracted.retractions == 3
    reads = 0

    def load() -> ServerLoad:  # the server's gauge: 2 retracted at one reading
        nonlocal reads
        reads += 1
        if reads == 1:
            loop.sample_done("job", retracted)
        return ServerLoad(running=48, gen_throughput=900, retracted=2 if reads == 3 else 0)

    loop = TunerLoop(InflightTuner(TunerConfig()), pool, load, window_seconds=0.3, sample_seconds=0.02)
    release = hold(pool, 48)
    try:
        window = loop.measure()
    finally:
        release.set()
    assert window is not None and reads >= 3
    assert window.retractions == 3 + 2


def test_a_short_window_moves_nothing_and_its_debug_line_says_so(
    pool: RequestPool, caplog: pytest.LogCaptureFixture
) -> None:
    changes: list[TunerState] = []
    loop = TunerLoop(InflightTuner(TunerConfig()), pool, ServerLoad, on_change=changes.append)
    caplog.set_level(logging.DEBUG, logger="workers.flow.tuner_loop")
    # the server saw 24 of the 48 the worker holds: the requests are still reaching it
    assert loop.apply(Window(target=48, seconds=6, tokens_per_s=2000, running=24)) == 48
    assert pool.max_inflight == 48 and changes == []
    line = caplog.records[-1].getMessage()
    assert line.endswith("queued 0.0, KV 0.00 (short: the server saw under the target; not judged)")
