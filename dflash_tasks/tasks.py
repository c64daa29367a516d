"""The Celery task: thin, it only hands the delivery to the worker runtime."""

from __future__ import annotations

from typing import Any

from celery import Task

from dflash_tasks import metrics, worker_runtime
from dflash_tasks.celery_app import TASK_NAME, app


@app.task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
def run_chunk_task(self: Task, job_id: str, chunk: int) -> dict[str, Any]:
    """Generate and store chunk ``chunk`` of job ``job_id`` (a no-op when it is already done)."""
    result = worker_runtime.current().handle_delivery(job_id, int(chunk), str(self.request.id))
    metrics.delivery(result, redelivered=bool((self.request.delivery_info or {}).get("redelivered")))
    return result
