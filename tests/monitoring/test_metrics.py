"""The worker's Prometheus listener: what each event counts; and the fan-out that keeps a broken
observer from ever failing the work."""

from __future__ import annotations

import socket
from concurrent.futures import Future

import pytest
import redis

from dflash_tasks.coord.keys import queue_keys
from dflash_tasks.coord.live_progress import LiveProgress
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.record import Record
from dflash_tasks.core.spec_stats import SampleCounts, sample_counts
from dflash_tasks.core.states import Cause, Delivery, ErrorKind
from dflash_tasks.monitoring import metrics
from dflash_tasks.monitoring.metrics import PrometheusListener
from tests.helpers import free_port
from workers.leased_work import report_sample
from workers.monitor.listener import Listeners

WORKER = "gpu-test@h"
PROM = PrometheusListener(WORKER, "http://127.0.0.1:1")


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, {"worker": WORKER, **labels}) or 0.0


def test_delivery_outcomes_and_redeliveries() -> None:
    before = {
        o: value("dflash_chunks_total", outcome=o)
        for o in ("done", "skipped_done", "skipped_leased", "requeued")
    }
    redelivered = value("dflash_redeliveries_total")
    unhealthy = value("dflash_chunks_requeued_total", reason="server_unhealthy")
    PROM.delivery(DeliveryOutcome(Delivery.DONE), False)
    PROM.delivery(DeliveryOutcome(Delivery.SKIPPED, "already done", Cause.ALREADY_DONE), True)
    PROM.delivery(DeliveryOutcome(Delivery.SKIPPED, "running elsewhere", Cause.LEASED_ELSEWHERE), True)
    PROM.delivery(DeliveryOutcome(Delivery.REQUEUED, "server unhealthy", Cause.SERVER_UNHEALTHY), False)
    for outcome in before:
        assert value("dflash_chunks_total", outcome=outcome) == before[outcome] + 1
    assert value("dflash_redeliveries_total") == redelivered + 2
    assert value("dflash_chunks_requeued_total", reason="server_unhealthy") == unhealthy + 1


def test_sample_futures_count_samples_and_tokens() -> None:
    ok, failed = (
        value("dflash_samples_total", job="jm", status="ok"),
        value("dflash_samples_total", job="jm", status="failed"),
    )
    tokens = value("dflash_generated_tokens_total", job="jm")
    done = report_sample(Listeners([PROM]), "jm", sample_counts)
    for record in (
        {"id": "a", "status": "ok", "usage": {"completion_tokens": 120, "prompt_tokens": 9}},
        {"id": "b", "status": "failed", "usage": {"completion_tokens": 0, "prompt_tokens": 9}},
    ):
        fut: Future[Record] = Future()
        fut.set_result(Record.from_dict(record))
        done(fut)
    broken: Future[Record] = Future()
    broken.set_exception(RuntimeError("server died"))
    done(broken)  # a failed future is not a sample
    assert value("dflash_samples_total", job="jm", status="ok") == ok + 1
    assert value("dflash_samples_total", job="jm", status="failed") == failed + 1
    assert value("dflash_generated_tokens_total", job="jm") == tokens + 120


def test_errors_and_retries_by_kind() -> None:
    errors, retries = (
        value("dflash_request_errors_total", kind="http_503"),
        value("dflash_request_retries_total", kind="http_503"),
    )
    PROM.request_failed(RetryableError("HTTP 503: queue full", ErrorKind.HTTP_503), True)
    PROM.request_failed(RetryableError("HTTP 503: queue full", ErrorKind.HTTP_503), False)  # the last
    assert value("dflash_request_errors_total", kind="http_503") == errors + 2
    assert value("dflash_request_retries_total", kind="http_503") == retries + 1


def test_a_broken_observer_never_reaches_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def labels(self, *args: object) -> object:
            raise RuntimeError("metric backend broken")

    seen: list[str] = []

    class Recorder:
        def sample_done(self, job_id: str, counts: SampleCounts) -> None:
            seen.append(job_id)

        def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
            seen.append("delivery")

    monkeypatch.setattr(metrics, "SAMPLES", Broken())
    counts = sample_counts(Record.from_dict({"id": "a", "status": "ok", "usage": {"completion_tokens": 5}}))
    with pytest.raises(RuntimeError):
        PROM.sample_done("jm", counts)  # the listener itself raises
    fan_out = Listeners([PROM, Recorder()])  # type: ignore[list-item]
    fan_out.sample_done("jm", counts)  # what the worker calls swallows it, and the others still hear
    fan_out.delivery(None, False)  # type: ignore[arg-type]
    assert seen == ["jm", "delivery"]


def test_a_taken_port_disables_metrics_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert metrics.start_server(port) is False
    assert "give each worker on a machine its own --metrics-port" in caplog.text
    assert metrics.start_server(0) is False


def test_spec_counters_and_the_accept_length_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens, verify = (
        value("dflash_spec_tokens_total", job="js"),
        value("dflash_spec_verify_passes_total", job="js"),
    )
    spec_record = {
        "id": "a",
        "status": "ok",
        "usage": {"completion_tokens": 300, "prompt_tokens": 9},
        "meta_info": {"spec_verify_ct": 120, "spec_accept_length": 2.5},
    }
    PROM.sample_done("js", sample_counts(Record.from_dict(spec_record)))
    PROM.sample_done(
        "js",
        sample_counts(
            Record.from_dict(
                {"id": "b", "status": "ok", "usage": {"completion_tokens": 50}, "meta_info": None}
            )
        ),
    )
    assert value("dflash_spec_tokens_total", job="js") == tokens + 300  # only the sample with verify passes
    assert value("dflash_spec_verify_passes_total", job="js") == verify + 120

    def gauge(source: str) -> float | None:
        labels = {"worker": WORKER, "endpoint": PROM.endpoint, "source": source}
        return metrics.REGISTRY.get_sample_value("dflash_spec_accept_length", labels)

    monkeypatch.setattr(PROM, "server_accept", None)
    monkeypatch.setattr(PROM, "recent_accept", lambda: None)
    assert gauge("per_request") is None and gauge("server_lifetime") is None  # nothing known yet
    PROM.server_accept = 3.6
    assert gauge("server_lifetime") == 3.6 and gauge("per_request") is None
    PROM.recent_accept = lambda: 2.75
    assert gauge("per_request") == 2.75 and gauge("server_lifetime") is None  # one series: the best source


def test_queue_depth_is_read_at_scrape_time(rclient: redis.Redis, prefix: str) -> None:
    live = LiveProgress(rclient, prefix)
    queue = f"{prefix}-q"
    gauge = metrics.QueueDepth(live, lambda: [queue])
    rclient.rpush(queue, b"a", b"b")
    rclient.rpush(queue_keys(queue)[1], b"c")  # a priority list counts too
    try:
        (family,) = gauge.collect()
        assert [(s.labels, s.value) for s in family.samples] == [({"queue": queue}, 3.0)]
    finally:
        rclient.delete(*queue_keys(queue))
    down = metrics.QueueDepth(LiveProgress(redis.Redis(port=free_port()), prefix), lambda: [queue])
    assert list(down.collect()) == []  # Redis away: no sample rather than a wrong one
