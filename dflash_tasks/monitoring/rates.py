"""The math of a job's progress: rates over the last minute, ETA, GPU time, cost and the
speculative-decoding accept length (:mod:`dflash_tasks.monitoring.progress` assembles them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dflash_tasks.coord.progress_keys import BUCKET_SECONDS, window_bounds
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER, pooled_accept_length
from dflash_tasks.monitoring.progress_document import SpecSection, WorkerRow
from dflash_tasks.monitoring.snapshot import Snapshot, num

#: The longest gap between two GPU-time ticks that is still billed (s): a gap longer than this
#: means nobody was watching (every process down), and is not counted.
GPU_GAP_CAP = 60.0


def eta_seconds(remaining: float, rate: float | None) -> float | None:
    """Seconds to finish ``remaining`` units at ``rate`` per second; None when the rate is unknown."""
    if remaining <= 0:
        return 0.0
    if rate is None or not rate > 0:
        return None
    return remaining / rate


def window_rate(
    buckets: Mapping[int, Mapping[str, float]], what: str, now: float, since: float | None
) -> float:
    """Per-second rate of counter ``what`` over the last minute of buckets.

    ``since`` (when the counting started, e.g. the job's or a worker's first chunk) shortens the
    window at the start, so the first minute is not diluted by time before anything ran.
    """
    start, end = window_bounds(now)
    begin = max(float(start), since) if since else float(start)
    span = end - begin
    if span < BUCKET_SECONDS:
        return 0.0
    total = sum(row.get(what, 0.0) for b, row in buckets.items() if start <= b < end)
    return total / span


def window_total(buckets: Mapping[int, Mapping[str, float]], what: str, now: float) -> float:
    """The sum of counter ``what`` over the last minute of buckets (the window of :func:`window_rate`)."""
    start, end = window_bounds(now)
    return sum(row.get(what, 0.0) for b, row in buckets.items() if start <= b < end)


def spec_summary(snap: Snapshot, workers: Sequence[WorkerRow], now: float) -> SpecSection:
    """The job's speculative-decoding accept length, and where it comes from.

    ``per_request``: Σ completion tokens / Σ verify passes of the samples' own ``meta_info``, over
    the stored chunks (``job``; the workers' live totals until a chunk is stored) and over the last
    minute (``window``). ``server_lifetime`` only when no sample reported verify passes: the mean
    of the live workers' server figures (``internal_states``, averaged over the server's life).
    """
    tokens, verify = snap.stats.get("spec_tokens", 0.0), snap.stats.get("spec_verify_ct", 0.0)
    if verify <= 0:
        tokens = sum(c.get("spec_tokens", 0.0) for c in snap.per_worker.values())
        verify = sum(c.get("verify", 0.0) for c in snap.per_worker.values())
    window = pooled_accept_length(
        window_total(snap.buckets, "spec_tokens", now), window_total(snap.buckets, "verify", now)
    )
    servers = [w.server_accept_length for w in workers if w.alive and w.server_accept_length]
    server = sum(servers) / len(servers) if servers else None
    job = pooled_accept_length(tokens, verify)
    shown: float | None = job if job is not None else server
    source = SOURCE_PER_REQUEST if job is not None else (SOURCE_SERVER if server is not None else None)
    return SpecSection(
        accept_length=rounded(shown, 3),
        source=source,
        job=rounded(job, 3),
        window=rounded(window, 3),
        tokens=int(tokens),
        verify_passes=int(verify),
        server_lifetime=rounded(server, 3),
    )


def gpu_seconds(job: Mapping[str, str], live_gpus: int, now: float, started_at: float | None) -> float:
    """GPU time spent: the ticks written so far, plus the live GPUs since the last tick.

    Without ticks (no writer has run yet) it is ``live_gpus * elapsed``.
    """
    tick = num(job.get("gpu_tick"))
    if job.get("finished_at"):
        return num(job.get("gpu_seconds"))
    if tick > 0:
        return num(job.get("gpu_seconds")) + live_gpus * min(max(0.0, now - tick), GPU_GAP_CAP)
    return live_gpus * max(0.0, now - started_at) if started_at else 0.0


def cost(
    gpu_hour_usd: float, gpu_secs: float, gpus: int, eta_s: float | None
) -> tuple[float | None, float | None]:
    """(spent, projected total) in USD; (None, None) without a price; projected None without an ETA."""
    if not gpu_hour_usd > 0:
        return None, None
    spent = gpu_hour_usd * gpu_secs / 3600.0
    if eta_s is None:
        return spent, None
    return spent, spent + gpu_hour_usd * gpus * eta_s / 3600.0


def rounded(x: float | None, digits: int) -> float | None:
    """``x`` rounded, None kept."""
    return None if x is None else round(x, digits)
