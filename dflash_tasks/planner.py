"""Planning: which chunks still need a message, computed from the store (the truth) and Redis.

A chunk needs a message unless its completions are stored, a live lease says it is running,
or a message for it already waits in the broker queue. Chunks whose lease expired (their
worker died) are claimed here and queued again.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from dflash_tasks.bookkeeping import Bookkeeping
from dflash_tasks.job import done_chunks
from dflash_tasks.publish import queued_chunks
from dflash_tasks.store import Store


@dataclass(frozen=True, slots=True)
class Plan:
    chunks: int
    done: frozenset[int]
    running: frozenset[int]
    queued: frozenset[int]
    to_enqueue: tuple[int, ...]

    @property
    def pending(self) -> int:
        """Chunks not yet done (queued, running or about to be queued)."""
        return self.chunks - len(self.done)


def plan_job(
    store: Store,
    bookkeeping: Bookkeeping | None,
    broker: redis.Redis | None,
    queue: str,
    job_id: str,
    chunks: int,
) -> Plan:
    """Plan ``job_id``; with ``bookkeeping=None`` (a dry run) Redis is not consulted."""
    done = frozenset(c for c in done_chunks(store) if c < chunks)
    running: frozenset[int] = frozenset()
    queued: frozenset[int] = frozenset()
    if bookkeeping is not None and broker is not None:
        for chunk in bookkeeping.expired_leases(job_id):
            bookkeeping.claim_expired(job_id, chunk)
        running = frozenset(bookkeeping.live_leases(job_id))
        queued = frozenset(queued_chunks(broker, queue, job_id))
    to_enqueue = tuple(c for c in range(chunks) if c not in done and c not in running and c not in queued)
    return Plan(chunks, done, running - done, queued - done - running, to_enqueue)
