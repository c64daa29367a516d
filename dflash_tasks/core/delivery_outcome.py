"""What became of one delivered chunk message, as one typed object.

The runners return it, the delivery handler makes it for what did not run, the listeners observe
it (:meth:`~dflash_tasks.monitoring.metrics.PrometheusListener.delivery` counts it), and only the
Celery task turns it into the dict it returns (``workers/task.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_tasks.core.states import Cause, Delivery


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    """A delivery's status and why; for a chunk or repair round that ran, what it stored."""

    status: Delivery
    reason: str = ""
    cause: Cause = Cause.NONE
    samples_ok: int = 0
    samples_failed: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
