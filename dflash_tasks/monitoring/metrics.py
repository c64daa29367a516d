"""Prometheus metrics of one worker process, to scrape next to SGLang's own ``/metrics``.

A worker runs the Celery threads pool (one process), so one registry per process is enough:
:func:`start_server` serves it on ``127.0.0.1:<metrics_port>`` (``DFLASH_METRICS_PORT``, default
9808; 0 disables it). The events are reported by the chunk runner, the sample generator and
the task through :class:`PrometheusListener`, one of the listeners the worker runtime hands its
code (``workers.monitor.listener``); they are cheap and work without a server (the counters just count).

Series (every one has a ``worker`` label):

    dflash_samples_total{job,status}          samples finished (status ok|failed)
    dflash_generated_tokens_total{job}        completion tokens (reasoning + answer)
    dflash_prompt_tokens_total{job}           prompt tokens
    dflash_spec_tokens_total{job}             completion tokens of samples that report verify passes
    dflash_spec_verify_passes_total{job}      their speculative-decoding verify passes
                                              (accept length over any range:
                                              rate(spec_tokens) / rate(spec_verify_passes))
    dflash_request_errors_total{kind}         failed generation attempts: timeout, connection,
                                              http_503, http_5xx, http_4xx, rejected (400),
                                              bad_response, abort, other
    dflash_request_retries_total{kind}        attempts retried after a retryable error
    dflash_chunks_total{outcome}              deliveries: done, skipped_done, skipped_leased,
                                              requeued, rerouted, paused, dropped
    dflash_chunks_requeued_total{reason}      server_unhealthy, error (store/Redis trouble),
                                              wrong_model (put on its model's queue),
                                              lease_expired, unleased_delivery (reconciler)
    dflash_redeliveries_total                 deliveries the broker flagged as redelivered
    dflash_chunk_seconds                      histogram: lease taken → chunk stored
    dflash_inflight_requests{endpoint}        requests in flight against the server
    dflash_waiting_requests{endpoint}         requests waiting for a slot (the backlog)
    dflash_max_inflight_requests{endpoint}    the in-flight target: requests kept in flight at most
    dflash_chunks_held                        chunks the worker holds now
    dflash_server_healthy{endpoint}           1 while the server passes its health check
    dflash_spec_accept_length{endpoint,source}  source="per_request": Σ tokens / Σ verify passes of
                                              this worker's samples of the last minute; else
                                              source="server_lifetime": the server's own
                                              avg_spec_accept_length (/server_info)
    dflash_queue_depth{queue}                 messages waiting in each queue the worker consumes
    dflash_worker_info{endpoint}              1, with the worker's endpoint
    dflash_job_*{job,...}                     the figures of the progress.json this worker wrote
                                              last (ETA, cost, totals, pause): monitoring.job_metrics
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dflash_tasks.coord.live_progress import LiveProgress
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER, SampleCounts
from dflash_tasks.core.states import Cause, Delivery, ErrorKind
from dflash_tasks.core.tuner_state import TunerState
from dflash_tasks.monitoring.job_metrics import JobProgressGauges

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

SAMPLES = Counter(
    "dflash_samples", "Samples finished, by job and status.", ["worker", "job", "status"], registry=REGISTRY
)
TOKENS = Counter(
    "dflash_generated_tokens", "Completion tokens generated.", ["worker", "job"], registry=REGISTRY
)
PROMPT_TOKENS = Counter("dflash_prompt_tokens", "Prompt tokens sent.", ["worker", "job"], registry=REGISTRY)
SPEC_TOKENS = Counter(
    "dflash_spec_tokens",
    "Completion tokens of samples that report speculative-decoding verify passes.",
    ["worker", "job"],
    registry=REGISTRY,
)
SPEC_VERIFY = Counter(
    "dflash_spec_verify_passes",
    "Speculative-decoding verify passes of those samples (meta_info spec_verify_ct).",
    ["worker", "job"],
    registry=REGISTRY,
)
REQUEST_ERRORS = Counter(
    "dflash_request_errors", "Failed generation attempts, by kind.", ["worker", "kind"], registry=REGISTRY
)
RETRIES = Counter(
    "dflash_request_retries",
    "Generation attempts retried after a retryable error, by kind.",
    ["worker", "kind"],
    registry=REGISTRY,
)
CHUNKS = Counter("dflash_chunks", "Chunk deliveries, by outcome.", ["worker", "outcome"], registry=REGISTRY)
REQUEUED = Counter(
    "dflash_chunks_requeued",
    "Chunks put back on the queue, by reason.",
    ["worker", "reason"],
    registry=REGISTRY,
)
REDELIVERIES = Counter(
    "dflash_redeliveries", "Deliveries the broker flagged as redelivered.", ["worker"], registry=REGISTRY
)
CHUNK_SECONDS = Histogram(
    "dflash_chunk_seconds",
    "Seconds from taking a chunk's lease to storing its completions.",
    ["worker"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "dflash_inflight_requests",
    "Requests in flight against the server.",
    ["worker", "endpoint"],
    registry=REGISTRY,
)
WAITING = Gauge(
    "dflash_waiting_requests",
    "Requests waiting for an in-flight slot.",
    ["worker", "endpoint"],
    registry=REGISTRY,
)
MAX_INFLIGHT = Gauge(
    "dflash_max_inflight_requests",
    "The in-flight target: requests the worker keeps in flight against the server at most.",
    ["worker", "endpoint"],
    registry=REGISTRY,
)
HELD = Gauge("dflash_chunks_held", "Chunks the worker holds now.", ["worker"], registry=REGISTRY)
HEALTHY = Gauge(
    "dflash_server_healthy", "1 while the bound server is healthy.", ["worker", "endpoint"], registry=REGISTRY
)
INFO = Gauge(
    "dflash_worker_info", "Always 1; labels name the worker.", ["worker", "endpoint"], registry=REGISTRY
)


class PrometheusListener:
    """The worker's events as Prometheus series (a listener in the sense of ``workers.monitor.listener``).

    One per worker process (the series live in the process-wide :data:`REGISTRY`); it also exports
    the worker's gauges (:meth:`watch_worker`, :meth:`watch_queue`) and its accept length.
    """

    def __init__(self, worker: str, endpoint: str, progress_fresh_s: float = 15.0) -> None:
        self.worker, self.endpoint = worker, endpoint
        self.server_accept: float | None = None  # the server's lifetime figure (polled)
        self.recent_accept: Callable[[], float | None] = _unknown  # per-request, last minute
        self.jobs = JobProgressGauges(worker, progress_fresh_s)
        INFO.labels(worker, endpoint).set(1)
        _register_once(AcceptLength(self))
        _register_once(self.jobs)

    # -- events --------------------------------------------------------------------------------
    def request_failed(self, exc: BaseException, will_retry: bool) -> None:
        kind = error_kind(exc)
        REQUEST_ERRORS.labels(self.worker, kind).inc()
        if will_retry:
            RETRIES.labels(self.worker, kind).inc()

    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        SAMPLES.labels(self.worker, job_id, "ok" if counts.ok else "failed").inc()
        TOKENS.labels(self.worker, job_id).inc(counts.completion_tokens)
        PROMPT_TOKENS.labels(self.worker, job_id).inc(counts.prompt_tokens)
        if counts.verify:
            SPEC_TOKENS.labels(self.worker, job_id).inc(counts.spec_tokens)
            SPEC_VERIFY.labels(self.worker, job_id).inc(counts.verify)

    def chunk_started(self, job_id: str) -> None:
        pass

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        CHUNK_SECONDS.labels(self.worker).observe(seconds)

    def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
        if redelivered:
            REDELIVERIES.labels(self.worker).inc()
        label = outcome.status.value
        if outcome.status == Delivery.SKIPPED:
            label = "skipped_done" if outcome.cause == Cause.ALREADY_DONE else "skipped_leased"
        CHUNKS.labels(self.worker, label).inc()
        if outcome.status in (Delivery.REQUEUED, Delivery.REROUTED):
            REQUEUED.labels(self.worker, (outcome.cause or Cause.ERROR).value).inc()

    def chunk_requeued(self, reason: str) -> None:
        REQUEUED.labels(self.worker, reason).inc()

    def progress_written(self, doc: Mapping[str, Any]) -> None:
        """This worker wrote ``doc`` as a job's progress.json: export its job-level figures."""
        self.jobs.written(doc)

    # -- gauges read at scrape time --------------------------------------------------------------
    def watch_worker(
        self,
        inflight: Callable[[], float],
        waiting: Callable[[], float],
        held: Callable[[], float],
        healthy: Callable[[], bool],
        max_inflight: Callable[[], float] | None = None,
    ) -> None:
        INFLIGHT.labels(self.worker, self.endpoint).set_function(inflight)
        if max_inflight is not None:
            MAX_INFLIGHT.labels(self.worker, self.endpoint).set_function(max_inflight)
        WAITING.labels(self.worker, self.endpoint).set_function(waiting)
        HELD.labels(self.worker).set_function(held)
        HEALTHY.labels(self.worker, self.endpoint).set_function(lambda: 1.0 if healthy() else 0.0)

    def watch_tuner(self, state: Callable[[], TunerState]) -> None:
        """Export the in-flight tuner's curve and phase (read from ``state()`` at scrape time)."""
        _register_once(TunerSeries(self.worker, state))

    def watch_queue(self, live: LiveProgress, queues: Callable[[], Sequence[str]]) -> None:
        """Export the depth of the queues ``queues()`` names (read through ``live``)."""
        _register_once(QueueDepth(live, queues))


class TunerSeries(Collector):
    """The in-flight tuner, read at scrape time: ``dflash_tuner_tokens_per_second{worker,target}``
    (its measured curve: the server's tokens/s at each target it tried) and
    ``dflash_tuner_phase{worker,phase,reason}`` (always 1: where it is and why)."""

    def __init__(self, worker: str, state: Callable[[], TunerState]) -> None:
        self.worker, self.state = worker, state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self.state()
        curve = GaugeMetricFamily(
            "dflash_tuner_tokens_per_second",
            "The in-flight tuner's measured curve: the server's tokens/s at each target it tried.",
            labels=["worker", "target"],
        )
        for point in state.curve:
            curve.add_metric([self.worker, str(point.target)], float(point.tokens_per_s))
        yield curve
        phase = GaugeMetricFamily(
            "dflash_tuner_phase",
            "Always 1: the in-flight tuner's phase and why.",
            labels=["worker", "phase", "reason"],
        )
        phase.add_metric([self.worker, state.phase, state.reason], 1.0)
        yield phase


def _unknown() -> float | None:
    return None


_registered: set[str] = set()


def _register_once(collector: Collector) -> None:
    """One collector of each kind per process (the registry refuses duplicates)."""
    name = type(collector).__name__
    if name not in _registered:
        _registered.add(name)
        REGISTRY.register(collector)


class AcceptLength(Collector):
    """``dflash_spec_accept_length{endpoint,source}``, chosen at scrape time.

    ``per_request`` (Σ tokens / Σ verify passes of the last minute's samples) when there is one,
    else the server's ``server_lifetime`` figure; nothing before either is known.
    """

    def __init__(self, listener: PrometheusListener) -> None:
        self._listener = listener

    def collect(self) -> Iterator[GaugeMetricFamily]:
        listener = self._listener
        try:
            value, source = listener.recent_accept(), SOURCE_PER_REQUEST
        except Exception:
            log.debug("per-request accept length unavailable", exc_info=True)
            value = None
        if value is None:
            value, source = listener.server_accept, SOURCE_SERVER
        if value is None:
            return
        family = GaugeMetricFamily(
            "dflash_spec_accept_length",
            "Speculative-decoding accept length: per_request (last minute of samples) or server_lifetime.",
            labels=["worker", "endpoint", "source"],
        )
        family.add_metric([listener.worker, listener.endpoint, source], value)
        yield family


def error_kind(exc: BaseException) -> str:
    """A short, bounded label for a failed attempt: the kind the client's error translation set."""
    kind = exc.kind if isinstance(exc, DflashError) else ErrorKind.OTHER
    return str(kind.value)


# --- the worker's gauges and the endpoint -----------------------------------------------------


class QueueDepth(Collector):
    """``dflash_queue_depth{queue}``: LLEN of each queue the worker consumes, read at scrape time."""

    def __init__(self, live: LiveProgress, queues: Callable[[], Sequence[str]]) -> None:
        self._live = live
        self._queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "dflash_queue_depth", "Messages waiting in the broker queue.", labels=["queue"]
        )
        try:
            depths = self._live.queue_depths(self._queues())
        except RetryableError as exc:
            log.debug("queue depth unavailable: %s", exc)
            return
        for queue, depth in depths.items():
            family.add_metric([queue], float(depth))
        yield family


def start_server(port: int, address: str = "127.0.0.1") -> bool:
    """Serve ``/metrics`` on ``address:port``; False (with a warning) when disabled or the port is taken."""
    if port <= 0:
        return False
    try:
        start_http_server(port, addr=address, registry=REGISTRY)
    except OSError as exc:
        log.warning(
            "Prometheus metrics disabled: cannot listen on %s:%d (%s); give each worker on a machine its "
            "own --metrics-port (or DFLASH_METRICS_PORT)",
            address,
            port,
            exc.strerror or exc,
        )
        return False
    log.info("Prometheus metrics on http://%s:%d/metrics", address, port)
    return True
