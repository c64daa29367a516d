"""The Celery task: thin, it hands the delivery to the worker's delivery handler, tells the
listeners, and makes the outcome the dict it returns (the one place a delivery becomes a dict)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task

from dflash_tasks.coord.celery_app import TASK_NAME
from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.repair import RepairUnit
from dflash_tasks.core.states import Cause, Delivery
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def register_chunk_task(app: Celery, runtime: WorkerRuntime) -> Task:
    """Register the chunk task on ``app``, bound to ``runtime``: the worker process's one runtime
    reaches the task through this closure, not through a module global."""

    @app.task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
    def run_chunk_task(
        self: Task,
        job_id: str,
        chunk: int,
        repair_round: int = 0,
        permanent: bool = False,
        max_tokens: int = 0,
    ) -> dict[str, Any]:
        """Generate and store chunk ``chunk`` of job ``job_id`` (a no-op when it is already done);
        with ``repair_round`` R >= 1, run repair round R of the stored chunk (``permanent``: also
        regenerate its permanent failures; ``max_tokens`` > 0: also its samples truncated at a
        smaller budget, with this one)."""
        valid = type(chunk) is int and type(job_id) is str and type(repair_round) is int
        valid = valid and type(permanent) is bool and type(max_tokens) is int
        if not valid or repair_round < 0 or chunk < 0 or max_tokens < 0:
            reason = (
                f"invalid message arguments: job {job_id!r}, chunk {chunk!r}, repair round {repair_round!r}"
            )
            log.error("dropping a message: %s", reason)
            outcome = DeliveryOutcome(Delivery.DROPPED, reason, Cause.BAD_MESSAGE)
        else:
            queue = str((self.request.delivery_info or {}).get("routing_key") or "")
            repair = RepairUnit(chunk, repair_round, permanent, max_tokens or None) if repair_round else None
            outcome = runtime.delivery.handle(job_id, chunk, str(self.request.id), queue, repair)
        runtime.listener.delivery(outcome, bool((self.request.delivery_info or {}).get("redelivered")))
        return task_result(outcome)

    task: Task = run_chunk_task
    return task


def task_result(outcome: DeliveryOutcome) -> dict[str, Any]:
    """What the task returns (JSON): the outcome's fields, its enums as their values."""
    return {
        "status": outcome.status.value,
        "reason": outcome.reason,
        "cause": outcome.cause.value,
        "samples_ok": outcome.samples_ok,
        "samples_failed": outcome.samples_failed,
        "completion_tokens": outcome.completion_tokens,
        "seconds": round(outcome.seconds, 3),
    }
