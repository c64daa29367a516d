"""The simulator's decode batch: speed, accept length and the KV cache follow the curve."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from dflash_tasks.sim.batch import BatchCurve, BatchRun, DecodeBatch
from dflash_tasks.sim.scheduler import Stopped


def run_many(batch: DecodeBatch, n: int, tokens: int, prompt: int = 10) -> tuple[list[BatchRun], float]:
    """``n`` requests at once; their results and the wall time until the last one finished."""
    stop, out, lock = threading.Event(), [], threading.Lock()

    def one() -> None:
        result = batch.run(tokens, prompt, stop)
        with lock:
            out.append(result)

    threads = [threading.Thread(target=one) for _ in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    batch.stop()
    return out, time.monotonic() - started


def test_the_curve_is_flat_while_memory_bound_then_gains_less() -> None:
    curve = BatchCurve(tokens_per_second=40, accept_length=3.6, knee=32, accept_halving=30)
    assert curve.request_rate(1) == pytest.approx(40, rel=0.01)  # one request alone: --tokens-per-second
    assert curve.throughput(48) > curve.throughput(16)
    assert curve.throughput(256) < curve.throughput(48)  # past the knee, MTP's gain falls
    ceiling = BatchCurve(tokens_per_second=40, accept_length=3.6, knee=200, graph_max_bs=128)
    assert ceiling.throughput(129) < ceiling.throughput(128)  # off the captured graphs


def test_a_bigger_batch_decodes_each_request_slower_and_sees_a_lower_accept_length() -> None:
    curve = BatchCurve(tokens_per_second=400, accept_length=3.6, knee=4, accept_halving=4)
    (alone,), one_s = run_many(DecodeBatch(curve, 1.0), 1, 200)
    many, many_s = run_many(DecodeBatch(curve, 1.0), 16, 200)
    assert one_s == pytest.approx(200 / curve.request_rate(1), rel=0.3)
    assert many_s == pytest.approx(200 / curve.request_rate(16), rel=0.3)
    assert alone.accept_length == pytest.approx(curve.accept(1), rel=0.01)
    assert all(r.accept_length == pytest.approx(curve.accept(16), rel=0.05) for r in many)


def test_past_the_kv_cache_requests_are_retracted_and_still_all_finish() -> None:
    # 8 requests of 10 + 400 tokens need 3,280 tokens of cache at the end; it holds 2,000
    curve = BatchCurve(tokens_per_second=2000, accept_length=1, kv_capacity=2000, reserve_ratio=0)
    runs, _ = run_many(DecodeBatch(curve, 1.0), 8, 400)
    assert len(runs) == 8
    assert sum(r.retractions for r in runs) > 0


@pytest.mark.parametrize("prefill_tokens", [0, 200])
def test_a_burst_of_new_requests_is_admitted_a_few_per_step_under_the_prefill_budget(
    prefill_tokens: int,
) -> None:
    # 10 ms steps; 48 prompts of 100 tokens under 200 a step: 2 a step, all in about 0.24 s
    curve = BatchCurve(tokens_per_second=100, accept_length=1, prefill_tokens=prefill_tokens)
    batch, stop = DecodeBatch(curve, 1.0), threading.Event()

    def one() -> None:
        with contextlib.suppress(Stopped):  # stopped before its 2 s of decoding end
            batch.run(200, 100, stop)

    threads = [threading.Thread(target=one) for _ in range(48)]
    for t in threads:
        t.start()
    seen = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        g = batch.gauges()
        seen.append((int(g["running"]), int(g["waiting"])))
        time.sleep(0.02)
    batch.stop()
    for t in threads:
        t.join(5)
    assert seen[-1] == (48, 0)  # all admitted within the second
    lagged = [s for s in seen if s[0] < 48 and s[1] > 0]
    if prefill_tokens:  # running rose toward the target step by step, the rest queued meanwhile
        assert len(lagged) >= 4, seen
        running = [r for r, _ in seen]
        assert running == sorted(running) and running[0] <= 8, seen
    else:  # all at once (a sample may catch the last threads still starting)
        assert len(lagged) <= 1, seen
