"""What a worker tells its observers, as they happen: one listener object, handed to the runtime.

The worker code calls ``listener.<event>(...)`` on a :class:`WorkerListener`; the runtime hands
it a :class:`Listeners` that fans each event out to Prometheus
(:class:`dflash_tasks.monitoring.metrics.PrometheusListener`) and to the live-progress counters
(:class:`workers.monitor.live_stats.StatsListener`). Monitoring must never fail the work, so an observer that
raises is logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.spec_stats import SampleCounts

log = logging.getLogger(__name__)


class WorkerListener(Protocol):
    """The events of a worker's life. Every method must be cheap: it runs on the worker's threads."""

    def request_failed(self, exc: BaseException, will_retry: bool) -> None:
        """A generation attempt failed with ``exc``; ``will_retry`` when another attempt follows."""

    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        """A sample finished; ``counts`` were read from its record once, for every listener."""

    def chunk_started(self, job_id: str) -> None:
        """This worker took the lease of one of ``job_id``'s chunks (for its first pass or a repair round)."""

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        """A chunk's completions (or a repair round's) were stored ``seconds`` after its lease was taken."""

    def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
        """A chunk message was handled; ``outcome`` is what became of it."""

    def chunk_requeued(self, reason: str) -> None:
        """A chunk went back on the queue outside a delivery (the reconciler: ``lease_expired``, ...)."""


class Listeners:
    """Several listeners as one; an observer that raises never reaches the caller."""

    def __init__(self, listeners: Sequence[WorkerListener] = ()) -> None:
        self._listeners = list(listeners)

    def _each(self, event: str, *args: Any) -> None:
        for listener in self._listeners:
            try:
                getattr(listener, event)(*args)
            except Exception:
                log.debug("listener %r failed on %s", listener, event, exc_info=True)

    def request_failed(self, exc: BaseException, will_retry: bool) -> None:
        self._each("request_failed", exc, will_retry)

    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        self._each("sample_done", job_id, counts)

    def chunk_started(self, job_id: str) -> None:
        self._each("chunk_started", job_id)

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        self._each("chunk_stored", job_id, seconds)

    def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
        self._each("delivery", outcome, redelivered)

    def chunk_requeued(self, reason: str) -> None:
        self._each("chunk_requeued", reason)


#: Nobody listening (plain-function tests, tools).
NO_LISTENER = Listeners()
