"""Putting chunk messages on the queue, and finding which chunks are already queued.

A message carries only ``(job_id, chunk)``; its task id ``<job>-<chunk>-<nonce>`` makes the
broker's queue readable without decoding message bodies. A repair round's message carries
``(job_id, chunk, round, permanent, max_tokens)`` (:class:`~dflash_tasks.core.repair.RepairUnit`;
``max_tokens`` 0 when the job has no truncated-repair budget) under the
task id ``<job>-<chunk>-r<round>-<nonce>``, which the chunk readers here never mistake for a chunk.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis
from celery import Celery

from dflash_tasks.coord.celery_app import TASK_NAME
from dflash_tasks.coord.connection import broker_errors, redis_errors
from dflash_tasks.coord.keys import UNACKED, UNACKED_INDEX
from dflash_tasks.core.repair import RepairUnit


def task_id(job_id: str, chunk: int) -> str:
    return f"{job_id}-{chunk:06d}-{uuid.uuid4().hex[:8]}"


def repair_task_id(job_id: str, unit: RepairUnit) -> str:
    return f"{job_id}-{unit.chunk:06d}-r{unit.round}-{uuid.uuid4().hex[:8]}"


def parse_repair_task_id(tid: str) -> tuple[str, int, int] | None:
    """(job id, chunk, round) of a task id made by :func:`repair_task_id`, else None."""
    parts = tid.split("-")
    if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    round_ = parts[2][1:]
    if parts[2][:1] != "r" or not (round_.isascii() and round_.isdigit()):
        return None
    return parts[0], int(parts[1]), int(round_)


def parse_task_id(tid: str) -> tuple[str, int] | None:
    """(job id, chunk) of a task id made by :func:`task_id`, else None."""
    parts = tid.split("-")
    if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None


@dataclass(frozen=True, slots=True)
class UnackedDelivery:
    """A message delivered to a worker and not acknowledged yet (kombu's Redis ack emulation)."""

    tag: str
    task_id: str
    delivered_at: float
    eta: float | None  # a re-queued chunk's countdown: it waits in a live worker until then

    def stale(self, now: float, grace: float) -> bool:
        """Whether a live worker would have leased it by now (so its worker must be dead)."""
        return max(self.delivered_at, self.eta or 0.0) < now - grace


def unacked_deliveries(client: redis.Redis) -> list[UnackedDelivery]:
    """Every unacknowledged delivery, from ``unacked_index`` / ``unacked``.

    A live worker leases a chunk milliseconds after delivery (or after its countdown), so an old
    delivery without a lease belongs to a dead worker.
    """
    with redis_errors("reading the broker's unacked messages"):
        rows = cast(list[tuple[bytes, float]], client.zrange(UNACKED_INDEX, 0, -1, withscores=True))
        if not rows:
            return []
        raws = cast(list[bytes | None], client.hmget(UNACKED, [tag for tag, _ in rows]))
    found: list[UnackedDelivery] = []
    for (tag, delivered_at), raw in zip(rows, raws, strict=True):
        headers = _unacked_headers(raw)
        if headers is not None:
            tid = str(headers.get("id") or "")
            eta = _timestamp(headers.get("eta"))
            found.append(UnackedDelivery(tag.decode(), tid, float(delivered_at), eta))
    return found


def unacked_repairs(client: redis.Redis, job_id: str, now: float, grace: float) -> set[tuple[int, int]]:
    """(chunk, round) of the repair messages of ``job_id`` live workers hold unacknowledged (see
    :func:`unacked_chunks`)."""
    held: set[tuple[int, int]] = set()
    for delivery in unacked_deliveries(client):
        parsed = parse_repair_task_id(delivery.task_id)
        if parsed is not None and parsed[0] == job_id and not delivery.stale(now, grace):
            held.add((parsed[1], parsed[2]))
    return held


def unacked_chunks(client: redis.Redis, job_id: str, now: float, grace: float) -> set[int]:
    """Chunks of ``job_id`` whose messages live workers hold unacknowledged: delivered recently, or
    waiting for their countdown (not a worker's ``held_chunks``: the chunks it runs now)."""
    held: set[int] = set()
    for delivery in unacked_deliveries(client):
        parsed = parse_task_id(delivery.task_id)
        if parsed is not None and parsed[0] == job_id and not delivery.stale(now, grace):
            held.add(parsed[1])
    return held


def _unacked_headers(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        payload = json.loads(raw)[0]
    except (ValueError, IndexError, TypeError, KeyError):
        return None
    headers = payload.get("headers") if isinstance(payload, dict) else None
    return headers if isinstance(headers, dict) else None


def _timestamp(value: object) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


#: Messages per Redis round trip when publishing many chunks.
PUBLISH_BATCH = 500


def publish_chunks(
    app: Celery, job_id: str, chunks: Iterable[int], *, queue: str, countdown: float | None = None
) -> int:
    """Queue one message per chunk on ``queue`` (the job's model queue, see
    :func:`dflash_tasks.coord.routing.model_queue`) over one producer connection; returns how many
    were sent.

    Many chunks go out in pipelined batches of :data:`PUBLISH_BATCH` (kombu's ``Producer.batch``),
    one round trip each, the queue declared once; a single chunk (a worker's re-queue) is published
    alone, with kombu's publish retries.
    """
    todo = list(chunks)
    if not todo:
        return 0
    sent = 0
    with broker_errors(lambda: f"publishing chunks ({sent} sent)"), app.producer_or_acquire() as producer:
        if len(todo) == 1:
            _send(app, producer, job_id, todo[0], queue, countdown)
            return 1
        producer.maybe_declare(app.amqp.queues[queue])
        for start in range(0, len(todo), PUBLISH_BATCH):
            batch = todo[start : start + PUBLISH_BATCH]
            with producer.batch(max_size=2 * len(batch) + 2):  # each message and its sent event
                for chunk in batch:
                    _send(app, producer, job_id, chunk, queue, countdown, declare=[], retry=False)
            sent += len(batch)
    return sent


def publish_repairs(
    app: Celery, job_id: str, units: Iterable[RepairUnit], *, queue: str, countdown: float | None = None
) -> int:
    """Queue one repair message per unit on ``queue`` (the job's model queue); returns how many."""
    sent = 0
    doing = lambda: f"publishing repair rounds ({sent} sent)"  # noqa: E731
    with broker_errors(doing), app.producer_or_acquire() as producer:
        for unit in units:
            app.send_task(
                TASK_NAME,
                args=(job_id, unit.chunk, unit.round, unit.permanent, unit.max_tokens or 0),
                task_id=repair_task_id(job_id, unit),
                producer=producer,
                queue=queue,
                countdown=countdown,
            )
            sent += 1
    return sent


def _send(
    app: Celery, producer: Any, job_id: str, chunk: int, queue: str, countdown: float | None, **options: Any
) -> None:
    app.send_task(
        TASK_NAME,
        args=(job_id, chunk),
        task_id=task_id(job_id, chunk),
        producer=producer,
        queue=queue,
        countdown=countdown,
        **options,
    )


def queued_chunks(client: redis.Redis, queue: str, job_id: str, page: int = 2000) -> set[int]:
    """Chunks of ``job_id`` whose messages wait in the broker queue (read page by page)."""
    found: set[int] = set()
    for tid in _queued_task_ids(client, queue, job_id + "-", page):
        parsed = parse_task_id(tid)
        if parsed is not None and parsed[0] == job_id:
            found.add(parsed[1])
    return found


def queued_repairs(client: redis.Redis, queue: str, job_id: str, page: int = 2000) -> set[tuple[int, int]]:
    """(chunk, round) of the repair messages of ``job_id`` waiting in the broker queue."""
    found: set[tuple[int, int]] = set()
    for tid in _queued_task_ids(client, queue, job_id + "-", page):
        parsed = parse_repair_task_id(tid)
        if parsed is not None and parsed[0] == job_id:
            found.add((parsed[1], parsed[2]))
    return found


def _queued_task_ids(client: redis.Redis, queue: str, prefix: str, page: int) -> Iterable[str]:
    """The task ids starting with ``prefix`` of the messages waiting in ``queue``, page by page."""
    start = 0
    while True:
        with redis_errors(f"reading the broker queue {queue!r}"):
            batch = cast(list[bytes], client.lrange(queue, start, start + page - 1))
        for raw in batch:
            tid = _message_task_id(raw)
            if tid.startswith(prefix):
                yield tid
        if len(batch) < page:
            return
        start += page


def _message_task_id(raw: bytes) -> str:
    try:
        headers = json.loads(raw).get("headers") or {}
        return str(headers.get("id") or "")
    except (ValueError, AttributeError):
        return ""
