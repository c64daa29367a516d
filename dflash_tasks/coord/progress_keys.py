"""Where a job's live progress lives: its store key and the time buckets of its rates.

Workers push their counts into 5-second rate buckets (:mod:`workers.monitor.live_stats`);
:mod:`dflash_tasks.monitoring.snapshot` reads the last minute of them and
:mod:`dflash_tasks.monitoring.progress_writer` bills GPU time, all through
:class:`dflash_tasks.coord.live_progress.LiveProgress`.

Key names: :mod:`dflash_tasks.coord.keys`; their expiry: :mod:`dflash_tasks.coord.live_progress`.

``spec_tokens`` and ``verify`` count the samples that reported speculative-decoding stats: their
completion tokens and verify passes (an accept length is the ratio of the two sums).

Losing these keys loses only history: rates rebuild within a minute; ``started_at`` and the
GPU time are re-seeded from the last ``progress.json``.
"""

from __future__ import annotations

#: The progress document's key in the output store.
PROGRESS_KEY = "progress.json"
#: Width of a rate bucket (s).
BUCKET_SECONDS = 5
#: The "last minute" of windowed rates (s).
WINDOW_SECONDS = 60
#: Workers push their counts at least this often (s); the window ends this long before now.
FLUSH_LAG = 2.5


def bucket_start(t: float) -> int:
    return int(t // BUCKET_SECONDS) * BUCKET_SECONDS


def window_bounds(now: float) -> tuple[int, int]:
    """[start, end) of the rate window: the last full minute of buckets that every worker flushed."""
    end = bucket_start(now - FLUSH_LAG)
    return end - WINDOW_SECONDS, end
