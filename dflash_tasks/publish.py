"""Putting chunk messages on the queue, and finding which chunks are already queued.

A message carries only ``(job_id, chunk)``; its task id ``<job>-<chunk>-<nonce>`` makes the
broker's queue readable without decoding message bodies.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import cast

import redis
from celery import Celery

from dflash_tasks.celery_app import TASK_NAME
from dflash_tasks.errors import RetryableError


def task_id(job_id: str, chunk: int) -> str:
    return f"{job_id}-{chunk:06d}-{uuid.uuid4().hex[:8]}"


def publish_chunks(app: Celery, job_id: str, chunks: Iterable[int], countdown: float | None = None) -> int:
    """Queue one message per chunk over one producer connection; returns how many were sent."""
    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for chunk in chunks:
                app.send_task(
                    TASK_NAME,
                    args=(job_id, chunk),
                    task_id=task_id(job_id, chunk),
                    producer=producer,
                    countdown=countdown,
                )
                sent += 1
    except (OSError, redis.RedisError) as exc:
        raise RetryableError(f"cannot publish to the broker after {sent} chunks: {exc}") from exc
    except Exception as exc:  # kombu wraps connection failures in its own OperationalError
        if type(exc).__name__ == "OperationalError":
            raise RetryableError(f"cannot publish to the broker after {sent} chunks: {exc}") from exc
        raise
    return sent


def queued_chunks(client: redis.Redis, queue: str, job_id: str, page: int = 2000) -> set[int]:
    """Chunks of ``job_id`` whose messages wait in the broker queue (read page by page)."""
    prefix = job_id + "-"
    found: set[int] = set()
    start = 0
    while True:
        try:
            batch = cast(list[bytes], client.lrange(queue, start, start + page - 1))
        except redis.RedisError as exc:
            raise RetryableError(f"cannot read the broker queue {queue!r}: {exc}") from exc
        for raw in batch:
            tid = _message_task_id(raw)
            if tid.startswith(prefix):
                chunk = tid[len(prefix) :].split("-", 1)[0]
                if chunk.isdigit():
                    found.add(int(chunk))
        if len(batch) < page:
            return found
        start += page


def _message_task_id(raw: bytes) -> str:
    try:
        headers = json.loads(raw).get("headers") or {}
        return str(headers.get("id") or "")
    except (ValueError, AttributeError):
        return ""
