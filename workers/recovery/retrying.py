"""Retrying a stored chunk's last steps (the store write, the Redis bookkeeping) in place.

By the time a chunk is written its records cost minutes of a GPU; a store or Redis hiccup at that
point must not throw them away. :func:`retry_transient` calls one step again, with exponential
backoff and full jitter, for at most ``seconds``, while the caller holds the chunk's lease (the
heartbeat keeps renewing it). When the time runs out the last error is raised: the chunk is
re-queued as before.

Only :class:`~dflash_tasks.core.errors.RetryableError` is retried: a full disk (ENOSPC, EDQUOT),
EIO, a stale NFS handle, S3 5xx / ``SlowDown`` / resets past botocore's own retries, Redis
unreachable. A :class:`~dflash_tasks.core.errors.PermanentError` (S3 403 or no bucket, a read-only
or unwritable folder, a bad key) is not: it needs a person, the retries would only hide it for
minutes per chunk, and the re-queue path counts it and parks the chunk after a few failures, so
``status`` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from dflash_tasks.core.errors import RetryableError
from workers.generation import RetryPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")


def retry_transient(
    step: Callable[[], T],
    doing: str,
    seconds: float,
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``step()``, called again after each :class:`RetryableError` until ``seconds`` have passed.

    The waits are ``policy.delay(attempt)`` (exponential, full jitter); a wait that would end past
    the deadline is not started: the error is raised instead. Each retry logs one WARNING naming
    ``doing`` and the cause. ``step`` must be safe to repeat (a write-once store write, a chunk
    completion that counts once).
    """
    deadline = clock() + seconds
    attempt = 0
    while True:
        attempt += 1
        try:
            return step()
        except RetryableError as exc:
            delay = policy.delay(attempt)
            if clock() + delay > deadline:
                raise
            log.warning("%s failed (attempt %d), retrying in %.1fs: %s", doing, attempt, delay, exc)
        sleep(delay)
