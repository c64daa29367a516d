"""Riding out a passing outage (a Redis restart) in ``enqueue --wait``, as its first pass does.

The first pass's wait polls every second and treats a :class:`~dflash_tasks.core.errors.RetryableError`
as "not this time"; the repair rounds run each step through :func:`ride_out`, which retries it at
the same pace until it goes through, so a restart costs a pause, not the producer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from dflash_tasks.core.errors import RetryableError

T = TypeVar("T")

#: Seconds between tries: the first pass's poll.
PACE = 1.0


def ride_out(
    step: Callable[[], T],
    what: str,
    tell: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``step()``, tried again every :data:`PACE` seconds for as long as it raises
    :class:`RetryableError`; ``tell`` hears when it first fails and when it went through again.
    A step must be safe to repeat (each re-reads what it depends on)."""
    failures = 0
    while True:
        try:
            result = step()
        except RetryableError as exc:
            if not failures:
                tell(f"{what} failed (retrying every {PACE:.0f}s): {exc}")
            failures += 1
            sleep(PACE)
            continue
        if failures:
            tell(f"{what}: done after {failures} failed tries")
        return result
