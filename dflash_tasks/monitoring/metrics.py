"""Prometheus metrics of one worker process, to scrape next to SGLang's own ``/metrics``.

A worker runs the Celery threads pool (one process), so one registry per process is enough:
:func:`start_server` serves it on ``127.0.0.1:<metrics_port>`` (``DFLASH_METRICS_PORT``, default
9808; 0 disables it). The hooks below are called from the chunk runner, the sample generator and
the task; they are cheap, work without a server (the counters just count), and never raise, so
monitoring can never fail a chunk. They also feed the live-progress counters of
:mod:`workers.stats` when a worker installed one (:func:`set_sink`).

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
    dflash_chunks_held                        chunks the worker holds now
    dflash_server_healthy{endpoint}           1 while the server passes its health check
    dflash_spec_accept_length{endpoint,source}  source="per_request": Σ tokens / Σ verify passes of
                                              this worker's samples of the last minute; else
                                              source="server_lifetime": the server's own
                                              avg_spec_accept_length (/server_info)
    dflash_queue_depth{queue}                 messages waiting in each queue the worker consumes
    dflash_worker_info{endpoint}              1, with the worker's endpoint
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, ParamSpec, Protocol

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dflash_tasks.coord.progress_keys import queue_keys
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER, spec_counts
from dflash_tasks.core.states import Cause, Delivery, ErrorKind

log = logging.getLogger(__name__)
P = ParamSpec("P")

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
HELD = Gauge("dflash_chunks_held", "Chunks the worker holds now.", ["worker"], registry=REGISTRY)
HEALTHY = Gauge(
    "dflash_server_healthy", "1 while the bound server is healthy.", ["worker", "endpoint"], registry=REGISTRY
)
INFO = Gauge(
    "dflash_worker_info", "Always 1; labels name the worker.", ["worker", "endpoint"], registry=REGISTRY
)


class StatsSink(Protocol):
    """Receives the per-sample and per-chunk events (the worker's live-progress counters)."""

    def sample_done(
        self, job_id: str, ok: bool, tokens: int, spec_tokens: int, verify: int, *, turns: int = 1
    ) -> None: ...

    def chunk_started(self, job_id: str) -> None: ...

    def chunk_done(self, job_id: str) -> None: ...


_worker = ""
_endpoint = ""
_sink: StatsSink | None = None


def configure(worker: str, endpoint: str) -> None:
    """Name this process's series (called once by the worker)."""
    global _worker, _endpoint
    _worker, _endpoint = worker, endpoint
    INFO.labels(worker, endpoint).set(1)


def set_sink(sink: StatsSink | None) -> None:
    global _sink
    _sink = sink


def _safe(fn: Callable[P, None]) -> Callable[P, None]:
    """Monitoring never fails the work: log and swallow any error of a hook."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.debug("metrics hook %s failed", fn.__name__, exc_info=True)

    return wrapper


# --- hooks ------------------------------------------------------------------------------------


@_safe
def sample_done(job_id: str, record: Mapping[str, Any]) -> None:
    """A sample's output record is ready (called once per sample, as it finishes)."""
    ok = record.get("status") == "ok"
    usage = record.get("usage") or {}
    tokens = int(usage.get("completion_tokens") or 0)
    SAMPLES.labels(_worker, job_id, "ok" if ok else "failed").inc()
    TOKENS.labels(_worker, job_id).inc(tokens)
    PROMPT_TOKENS.labels(_worker, job_id).inc(int(usage.get("prompt_tokens") or 0))
    spec_tokens, verify = spec_counts(record)
    if verify:
        SPEC_TOKENS.labels(_worker, job_id).inc(spec_tokens)
        SPEC_VERIFY.labels(_worker, job_id).inc(verify)
    if _sink is not None:
        _sink.sample_done(job_id, ok, tokens, spec_tokens, verify, turns=int(record.get("user_turns") or 1))


def on_sample_future(job_id: str) -> Callable[[Future[dict[str, Any]]], None]:
    """A done-callback for a sample's future: calls :func:`sample_done` with its record."""

    def done(future: Future[dict[str, Any]]) -> None:
        if not future.cancelled() and future.exception() is None:
            sample_done(job_id, future.result())

    return done


@_safe
def request_error(exc: BaseException, will_retry: bool) -> None:
    """A generation attempt failed with ``exc``; ``will_retry`` when another attempt follows."""
    kind = error_kind(exc)
    REQUEST_ERRORS.labels(_worker, kind).inc()
    if will_retry:
        RETRIES.labels(_worker, kind).inc()


@_safe
def chunk_started(job_id: str) -> None:
    """This worker took the lease of one of ``job_id``'s chunks."""
    if _sink is not None:
        _sink.chunk_started(job_id)


@_safe
def chunk_stored(job_id: str, seconds: float) -> None:
    """A chunk's completions were stored ``seconds`` after its lease was taken."""
    CHUNK_SECONDS.labels(_worker).observe(seconds)
    if _sink is not None:
        _sink.chunk_done(job_id)


@_safe
def delivery(result: Mapping[str, Any], redelivered: bool = False) -> None:
    """A chunk message was handled; ``result`` is what the task returned."""
    if redelivered:
        REDELIVERIES.labels(_worker).inc()
    status = str(result.get("status", ""))
    cause = str(result.get("cause", ""))
    if status == Delivery.SKIPPED:
        outcome = "skipped_done" if cause == Cause.ALREADY_DONE else "skipped_leased"
    else:
        outcome = status or "unknown"
    CHUNKS.labels(_worker, outcome).inc()
    if status in (Delivery.REQUEUED, Delivery.REROUTED):
        REQUEUED.labels(_worker, cause or Cause.ERROR.value).inc()


@_safe
def chunk_requeued(reason: str) -> None:
    """A chunk went back on the queue outside a delivery (e.g. the reconciler: ``lease_expired``)."""
    REQUEUED.labels(_worker, reason).inc()


def _unknown() -> float | None:
    return None


_server_accept: float | None = None
_recent_accept: Callable[[], float | None] = _unknown


@_safe
def accept_length(value: float) -> None:
    """The server's lifetime accept length (``internal_states``), polled by the worker."""
    global _server_accept
    _server_accept = value


def watch_accept_length(recent: Callable[[], float | None]) -> None:
    """Where the per-request accept length of the last minute comes from (the worker's stats)."""
    global _recent_accept
    _recent_accept = recent


class AcceptLength(Collector):
    """``dflash_spec_accept_length{endpoint,source}``, chosen at scrape time.

    ``per_request`` (Σ tokens / Σ verify passes of the last minute's samples) when there is one,
    else the server's ``server_lifetime`` figure; nothing before either is known.
    """

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            value, source = _recent_accept(), SOURCE_PER_REQUEST
        except Exception:
            log.debug("per-request accept length unavailable", exc_info=True)
            value = None
        if value is None:
            value, source = _server_accept, SOURCE_SERVER
        if value is None:
            return
        family = GaugeMetricFamily(
            "dflash_spec_accept_length",
            "Speculative-decoding accept length: per_request (last minute of samples) or server_lifetime.",
            labels=["worker", "endpoint", "source"],
        )
        family.add_metric([_worker, _endpoint, source], value)
        yield family


REGISTRY.register(AcceptLength())


def error_kind(exc: BaseException) -> str:
    """A short, bounded label for a failed attempt: the kind the client's error translation set."""
    kind = exc.kind if isinstance(exc, DflashError) else ErrorKind.OTHER
    return str(kind.value)


# --- the worker's gauges and the endpoint -----------------------------------------------------


class QueueDepth(Collector):
    """``dflash_queue_depth{queue}``: LLEN of each queue the worker consumes, read at scrape time."""

    def __init__(self, client: redis.Redis, queues: Callable[[], Sequence[str]]) -> None:
        self._client = client
        self._queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "dflash_queue_depth", "Messages waiting in the broker queue.", labels=["queue"]
        )
        try:
            queues = list(self._queues())
            pipe = self._client.pipeline(transaction=False)
            for queue in queues:
                for key in queue_keys(queue):
                    pipe.llen(key)
            lengths = [int(n) for n in pipe.execute()]
            per = len(lengths) // len(queues) if queues else 0
            for i, queue in enumerate(queues):
                family.add_metric([queue], float(sum(lengths[i * per : (i + 1) * per])))
        except redis.RedisError as exc:
            log.debug("queue depth unavailable: %s", exc)
            return
        yield family


def watch_worker(
    inflight: Callable[[], float],
    waiting: Callable[[], float],
    held: Callable[[], float],
    healthy: Callable[[], bool],
) -> None:
    """Gauges read from the worker's state at scrape time."""
    INFLIGHT.labels(_worker, _endpoint).set_function(inflight)
    WAITING.labels(_worker, _endpoint).set_function(waiting)
    HELD.labels(_worker).set_function(held)
    HEALTHY.labels(_worker, _endpoint).set_function(lambda: 1.0 if healthy() else 0.0)


_queue_collector: QueueDepth | None = None


def watch_queue(client: redis.Redis, queues: Callable[[], Sequence[str]]) -> None:
    """Export the depth of the queues ``queues()`` names at scrape time (once per process)."""
    global _queue_collector
    if _queue_collector is None:
        _queue_collector = QueueDepth(client, queues)
        REGISTRY.register(_queue_collector)


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
