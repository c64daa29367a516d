"""Live progress of a job: the numbers behind ``progress.json`` and ``python -m dflash_tasks.status``.

Data path. Every worker counts the samples it finishes in memory and pushes the counts to Redis
every couple of seconds (:mod:`workers.monitor.live_stats`; keys in :mod:`dflash_tasks.coord.progress_keys`),
together with a heartbeat of its own state. Any live process (each worker, ``enqueue --wait``)
then tries, every ``progress_seconds``, to take a short per-job lock; the one that gets it reads a
:class:`~dflash_tasks.monitoring.snapshot.Snapshot`, computes the job's progress here and writes
``progress.json`` at the output root (:mod:`dflash_tasks.monitoring.progress_writer`). ``status`` computes
the same document with the same code, so the two never disagree. Nothing depends on the producer
staying up.

This module is the math (rates, ETA, GPU time, cost, the document); only
:func:`compute_progress` does I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.progress_keys import BUCKET_SECONDS, WINDOW_SECONDS, window_bounds
from dflash_tasks.core.source_quality import progress_sources
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER, pooled_accept_length
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.fleet import alive, live_fleet, serving_warning
from dflash_tasks.monitoring.live_yield import yield_section
from dflash_tasks.monitoring.settled import settle, stats_of
from dflash_tasks.monitoring.snapshot import Snapshot, num, read_progress, read_snapshot
from dflash_tasks.store import Store

#: The ``version`` of the progress document.
FORMAT_VERSION = 1
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


def spec_summary(snap: Snapshot, workers: list[dict[str, Any]], now: float) -> dict[str, Any]:
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
    servers = [w["server_accept_length"] for w in workers if w["alive"] and w["server_accept_length"]]
    server = sum(servers) / len(servers) if servers else None
    job = pooled_accept_length(tokens, verify)
    shown: float | None = job if job is not None else server
    source = SOURCE_PER_REQUEST if job is not None else (SOURCE_SERVER if server is not None else None)
    return {
        "accept_length": _round(shown, 3),
        "source": source,
        "job": _round(job, 3),
        "window": _round(window, 3),
        "tokens": int(tokens),
        "verify_passes": int(verify),
        "server_lifetime": _round(server, 3),
    }


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


def summarize(snap: Snapshot, now: float, writer: str = "") -> dict[str, Any]:
    """The progress document (the content of ``progress.json``) from a snapshot; no I/O."""
    job = snap.job
    done_all = snap.done_chunks >= snap.total_chunks
    started = num(job.get("started_at")) or None
    finished = num(job.get("finished_at")) or None
    end = finished if (done_all and finished) else now
    elapsed = max(0.0, end - started) if started else None
    if snap.settled and not finished:  # finished at a time nobody recorded: unknown, not now - start
        elapsed = None

    failed = int(snap.stats.get("samples_failed", 0.0))
    counted_ok = snap.stats.get("samples_ok", 0.0)
    tokens = snap.stats.get("completion_tokens", 0.0)
    avg_tokens = tokens / counted_ok if counted_ok > 0 else None
    remaining = max(0, snap.total_samples - snap.done_samples)

    win_samples = window_rate(snap.buckets, "samples", now, started) if not done_all else 0.0
    win_tokens = window_rate(snap.buckets, "tokens", now, started) if not done_all else 0.0
    start_samples = snap.done_samples / elapsed if elapsed else 0.0
    start_tokens = tokens / elapsed if elapsed else 0.0
    # A job with multi-turn conversations is measured in turns (a three-turn conversation costs
    # three generations): its ETA is the remaining turns at the turn rate.
    multi_turn = snap.total_turns is not None and snap.total_turns != snap.total_samples
    total_turns = snap.total_samples if snap.total_turns is None else snap.total_turns
    done_turns = snap.done_samples if snap.done_turns is None else snap.done_turns
    remaining_turns = max(0, total_turns - done_turns)
    win_turns = win_samples
    if multi_turn and not done_all:
        win_turns = window_rate(snap.buckets, "turns", now, started)
    start_turns = done_turns / elapsed if elapsed else 0.0
    if multi_turn:
        basis, rate = ("last_minute", win_turns) if win_turns > 0 else ("since_start", start_turns)
        eta = eta_seconds(remaining_turns, rate)
    else:
        basis, rate = ("last_minute", win_samples) if win_samples > 0 else ("since_start", start_samples)
        eta = eta_seconds(remaining, rate)
    tok_rate = win_tokens if win_tokens > 0 else start_tokens
    eta_tokens = eta_seconds(remaining * avg_tokens, tok_rate) if avg_tokens is not None else None
    if remaining == 0:
        eta_tokens = 0.0

    workers = _workers(snap, now)
    live = sum(1 for w in workers if w["alive"])
    gpu_s = num(job.get("gpu_seconds")) if snap.settled else gpu_seconds(job, live, now, started)
    spent, projected = cost(snap.gpu_hour_usd, gpu_s, live, eta)
    spec = spec_summary(snap, workers, now)

    state = JobState.DONE if done_all else JobState.parse(job.get("state") or "")
    warnings: list[str] = []
    if not snap.redis_ok:
        warnings.append("Redis unreachable: rates, running chunks and workers are unknown")
    elif not done_all:
        serving = serving_warning(snap.model, live_fleet({**snap.workers, **snap.fleet}, now))
        if serving:
            warnings.append(serving + f"; the job's chunks wait in queue {snap.queue or '?'}")
        elif live == 0:
            warnings.append("no live worker has touched this job in the last minute")
    counted = counted_ok + failed
    warnings += snap.notes
    if snap.redis_ok and counted < snap.done_samples:
        warnings.append(
            f"token and failure counts cover {int(counted):,} of {snap.done_samples:,} stored samples "
            "(Redis lost its counters; the store is complete)"
        )
    counters = {
        k: v
        for k, v in snap.stats.items()
        if not k.startswith(("samples_", "completion_", "prompt_", "spec_"))
        and k not in ("turns", "generations")
    }
    return {
        "version": FORMAT_VERSION,
        "job_id": snap.job_id,
        "output": snap.output,
        "model": snap.model,
        "state": state,
        "pause_reason": (job.get("pause_reason") or None) if state == JobState.PAUSED else None,
        "updated_at": round(now, 3),
        "updated_at_iso": _iso(now),
        "writer": writer,
        "started_at": started,
        "finished_at": finished if done_all else None,
        "elapsed_s": _round(elapsed, 1),
        "samples": {
            "total": snap.total_samples,
            "done": snap.done_samples,
            "ok": max(0, snap.done_samples - failed),
            "failed": failed,  # the current records: a repaired sample counts as ok
            "repaired": int(snap.stats.get("samples_repaired", 0.0)),
            "remaining": remaining,
            "invalid_lines": snap.invalid_lines,
        },
        "turns": {
            "total": total_turns,
            "done": done_turns,
            "remaining": remaining_turns,
            "generated": int(snap.stats.get("generations", 0.0)) or None,
        },
        "chunks": {
            "total": snap.total_chunks,
            "done": snap.done_chunks,
            "running": snap.running_chunks,
            "pending": max(0, snap.total_chunks - snap.done_chunks - snap.running_chunks),
        },
        "queue": snap.queue or None,
        "queue_depth": snap.queue_depth,
        "tokens": {
            "generated": int(tokens),
            "prompt": int(snap.stats.get("prompt_tokens", 0.0)),
            "avg_per_sample": _round(avg_tokens, 1),
            "counted_samples": int(counted),
        },
        "rates": {
            "window_s": WINDOW_SECONDS,
            "samples_per_s": round(win_samples, 3),
            "turns_per_s": round(win_turns, 3),
            "tokens_per_s": round(win_tokens, 1),
            "since_start": {
                "samples_per_s": round(start_samples, 3),
                "turns_per_s": round(start_turns, 3),
                "tokens_per_s": round(start_tokens, 1),
            },
        },
        "eta_s": _round(eta, 0),
        "eta_at_iso": _iso(now + eta) if eta else None,
        "eta_basis": basis if eta else None,
        "eta_unit": "turns" if multi_turn else "samples",
        "eta_by_tokens_s": _round(eta_tokens, 0),
        "cost": {
            "gpu_hour_usd": snap.gpu_hour_usd or None,
            "gpus": live,
            "gpu_hours": round(gpu_s / 3600.0, 4),
            "usd": _round(spent, 2),
            "projected_total_usd": _round(projected, 2),
        },
        "trainable_tokens": _trainable(snap.trainable),
        "yield": yield_section(snap.stats, spent),
        "sources": progress_sources(snap.staged_sources, snap.source_quality, spent),
        "spec_accept_length": spec["accept_length"],
        "spec": spec,
        "workers": workers,
        "counters": counters,
        "warnings": warnings,
    }


def _trainable(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The dataset's trainable (loss) tokens as last counted (trainable.json), or None."""
    if not doc:
        return None
    keys = (
        "source",
        "written_at",
        "counted_samples",
        "total_loss_tokens",
        "mean_per_sample",
        "samples_in_job",
        "projected_total_loss_tokens",
        "max_length",
    )
    return {k: doc.get(k) for k in keys}


def _workers(snap: Snapshot, now: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in sorted(snap.per_worker):
        counts = snap.per_worker[name]
        beat = snap.workers.get(name, {})
        first = counts.get("first") or None
        server = num(beat.get("server_accept_length")) or None
        own = pooled_accept_length(counts.get("spec_tokens", 0.0), counts.get("verify", 0.0))
        window = pooled_accept_length(
            window_total(snap.buckets, f"{name}|spec_tokens", now),
            window_total(snap.buckets, f"{name}|verify", now),
        )
        accept, source = (own, SOURCE_PER_REQUEST) if own is not None else (server, SOURCE_SERVER)
        rows.append(
            {
                "name": name,
                "endpoint": beat.get("endpoint", ""),
                "alive": bool(beat) and alive(beat, now),
                "last_seen_s": _round(now - num(beat.get("last_seen")), 1) if beat else None,
                "healthy": beat.get("healthy") == "1" if beat else None,
                "samples": int(counts.get("samples", 0.0)),
                "failed": int(counts.get("failed", 0.0)),
                "tokens": int(counts.get("tokens", 0.0)),
                "chunks": int(counts.get("chunks", 0.0)),
                "samples_per_s": round(window_rate(snap.buckets, f"{name}|samples", now, first), 3),
                "tokens_per_s": round(window_rate(snap.buckets, f"{name}|tokens", now, first), 1),
                "inflight": int(num(beat.get("inflight"))),
                "waiting": int(num(beat.get("waiting"))),
                "max_inflight": int(num(beat.get("max_inflight"))),
                "held_chunks": int(num(beat.get("held_chunks"))),
                "spec_accept_length": _round(accept, 3),
                "spec_accept_source": source if accept is not None else None,
                "spec_accept_length_window": _round(window, 3),
                "server_accept_length": _round(server, 3),
                "tuner": _tuner(beat.get("tuner", "")),
            }
        )
    return rows


def _tuner(field: str) -> dict[str, Any] | None:
    """The in-flight tuner's state a worker put in its heartbeat (JSON), or None (a fixed target)."""
    if not field:
        return None
    try:
        doc = json.loads(field)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def compute_progress(
    store: Store,
    bookkeeping: Bookkeeping | None,
    job_id: str,
    now: float | None = None,
    *,
    queue: str = "",
    gpu_hour_usd: float | None = None,
    default_gpu_hour_usd: float = 0.0,
    writer: str = "",
) -> dict[str, Any]:
    """The progress document of ``job_id`` (read-only: what ``status`` prints)."""
    now = time.time() if now is None else now
    snap = read_snapshot(
        store,
        bookkeeping,
        job_id,
        now,
        queue=queue,
        gpu_hour_usd=gpu_hour_usd,
        default_gpu_hour_usd=default_gpu_hour_usd,
    )
    if not snap.redis_ok or not snap.job.get("started_at"):
        previous = read_progress(store)
        settled = settle(store, snap, previous)
        if settled is not None:
            snap = settled
        elif previous and previous.get("job_id") == job_id:
            snap = carry_over(snap, previous)
    return summarize(snap, now, writer)


def carry_over(snap: Snapshot, previous: Mapping[str, Any]) -> Snapshot:
    """Fill what Redis cannot tell (it is unreachable, or lost its keys) from the last progress.json."""
    job = dict(snap.job)
    if previous.get("started_at") and not job.get("started_at"):
        job["started_at"] = str(previous["started_at"])
    if snap.redis_ok:
        return replace(snap, job=job)
    cost_doc = previous.get("cost") or {}
    if previous.get("finished_at"):
        job["finished_at"] = str(previous["finished_at"])
    job.update(gpu_seconds=str(num(cost_doc.get("gpu_hours")) * 3600.0), gpu_tick=str(previous["updated_at"]))
    spec = previous.get("spec") or {}
    stats = stats_of(previous)
    if isinstance(spec, Mapping) and spec.get("source") == SOURCE_PER_REQUEST:
        stats |= {"spec_tokens": num(spec.get("tokens")), "spec_verify_ct": num(spec.get("verify_passes"))}
    note = f"counts other than done chunks are from progress.json of {previous.get('updated_at_iso')}"
    price = snap.gpu_hour_usd or num(cost_doc.get("gpu_hour_usd"))
    return replace(snap, job=job, stats=stats, notes=(*snap.notes, note), gpu_hour_usd=price)
