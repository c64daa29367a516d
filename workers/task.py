"""The Celery task: thin, it only hands the delivery to the worker runtime."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task

from dflash_tasks.coord.celery_app import TASK_NAME
from dflash_tasks.core.states import Cause, Delivery
from workers.runtime import WorkerRuntime, delivery_result

log = logging.getLogger(__name__)


def register_chunk_task(app: Celery, runtime: WorkerRuntime) -> Task:
    """Register the chunk task on ``app``, bound to ``runtime``: the worker process's one runtime
    reaches the task through this closure, not through a module global."""

    @app.task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
    def run_chunk_task(self: Task, job_id: str, chunk: int) -> dict[str, Any]:
        """Generate and store chunk ``chunk`` of job ``job_id`` (a no-op when it is already done)."""
        if type(chunk) is not int or type(job_id) is not str:  # a hand-made message: nothing to run
            reason = f"invalid message arguments: job {job_id!r}, chunk {chunk!r}"
            log.error("dropping a message: %s", reason)
            result = delivery_result(Delivery.DROPPED, reason, Cause.BAD_MESSAGE)
        else:
            queue = str((self.request.delivery_info or {}).get("routing_key") or "")
            result = runtime.handle_delivery(job_id, chunk, str(self.request.id), queue)
        runtime.listener.delivery(result, bool((self.request.delivery_info or {}).get("redelivered")))
        return result

    task: Task = run_chunk_task
    return task
