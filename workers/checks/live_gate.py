"""The live quality gate: pause a job when its recent samples go bad.

After each chunk, the worker adds the chunk's check counts to a short list in Redis and judges
the newest ``window`` samples with the job's gates. A tripped gate pauses the job: workers stop
taking its chunks (nothing running is lost), and ``python -m dflash_tasks.resume`` or a re-run
of enqueue continues it once the cause is fixed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.quality import GateFailure, QualitySettings, evaluate_gates

log = logging.getLogger(__name__)

#: Chunk summaries kept in Redis: enough for the window with chunks as small as 4 samples.
_KEEP = 256


def window_counts(entries: list[dict[str, Any]], window: int) -> tuple[int, Counter[str]]:
    """Sum the newest entries until they cover ``window`` samples."""
    total = 0
    counts: Counter[str] = Counter()
    for entry in entries:
        total += int(entry.get("n", 0))
        counts.update(dict(entry.get("checks") or {}))
        if total >= window:
            break
    return total, counts


def record_chunk_and_judge(
    bookkeeping: Bookkeeping,
    job_id: str,
    samples: int,
    checks: Mapping[str, int],
    settings: QualitySettings,
    temperature: float | None = None,
) -> list[GateFailure]:
    """Record one chunk's checks; pause the job and return the failures when a gate trips
    (``temperature``: the job's, which names the likely cause of loops)."""
    entries = bookkeeping.push_recent(job_id, {"n": samples, "checks": dict(checks)}, _KEEP)
    total, counts = window_counts(entries, settings.window)
    if total < settings.min_samples:
        return []
    failures = evaluate_gates(total, counts, settings, temperature)
    if failures:
        reason = f"quality gate over the last {total} samples: " + "; ".join(f.message for f in failures)
        if bookkeeping.pause_job(job_id, reason):
            log.error("job %s paused: %s", job_id, reason)
    return failures
