"""A chunk whose worker froze (or lost its machine) is re-queued once per reconciler pass, not twice.

Found by the chaos run: a frozen worker leaves both an expired lease and an old unacknowledged
delivery of the chunk; one pass re-queued it for the lease, then again as "delivered to a worker
that died before starting it", so the chunk had two messages (the second one a wasted delivery).
"""

from __future__ import annotations

import time
from pathlib import Path

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.store import LocalStore
from tests.workers.test_reconciler import JOB, bk, deliver, reconciler

__all__ = ["bk"]  # the fixture


def test_a_frozen_workers_chunk_is_requeued_once(bk: Bookkeeping, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    bk.register_job(JOB, str(tmp_path))
    bk.acquire(JOB, 5, "frozen", 0.01)  # its lease expired: nobody renews it
    deliver(bk, 5, age=60)  # and its delivery, taken long ago, was never acknowledged
    time.sleep(0.05)
    calls: list[tuple[str, int]] = []
    rec = reconciler(bk, store, calls)
    assert rec.run_once() == [(JOB, 5)]
    assert calls == [(JOB, 5)]
    time.sleep(0.02)
    bk.client.delete(f"{bk.prefix}:lock:reconcile")  # a later pass, the new message still queued
    assert rec.run_once() == [] and calls == [(JOB, 5)]
