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
:func:`compute_document` does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.progress_keys import WINDOW_SECONDS
from dflash_tasks.core.source_quality import progress_sources
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring.fleet import live_fleet, serving_warning
from dflash_tasks.monitoring.live_yield import yield_section
from dflash_tasks.monitoring.progress_document import (
    FORMAT_VERSION,
    ChunksSection,
    CostSection,
    Eta,
    Header,
    ProgressDocument,
    RateFigures,
    RatesSection,
    SamplesSection,
    TokensSection,
    TurnsSection,
)
from dflash_tasks.monitoring.rates import (
    GPU_GAP_CAP,
    cost,
    eta_seconds,
    gpu_seconds,
    rounded,
    spec_summary,
    window_rate,
    window_total,
)
from dflash_tasks.monitoring.settled import settle, stats_of
from dflash_tasks.monitoring.snapshot import Snapshot, num, read_progress, read_snapshot
from dflash_tasks.monitoring.worker_rows import worker_rows
from dflash_tasks.store import Store

__all__ = [
    "FORMAT_VERSION",
    "GPU_GAP_CAP",
    "carry_over",
    "compute_document",
    "cost",
    "eta_seconds",
    "gpu_seconds",
    "progress_document",
    "window_rate",
    "window_total",
]


@dataclass(frozen=True, slots=True)
class Clock:
    """When the job ran: its start, its end (recorded, or now while it runs) and the time between."""

    started: float | None
    finished: float | None
    elapsed: float | None
    done_all: bool

    @classmethod
    def of(cls, snap: Snapshot, now: float) -> Clock:
        done_all = snap.done_chunks >= snap.total_chunks
        started = num(snap.job.get("started_at")) or None
        finished = num(snap.job.get("finished_at")) or None
        end = finished if (done_all and finished) else now
        elapsed = max(0.0, end - started) if started else None
        if snap.settled and not finished:  # finished at a time nobody recorded: unknown, not now - start
            elapsed = None
        return cls(started, finished, elapsed, done_all)

    def per_second(self, count: float) -> float:
        """``count`` over the elapsed time: the rate since the start (0 before it)."""
        return count / self.elapsed if self.elapsed else 0.0


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast the job goes, over the last minute and since the start, and when it will be done.

    A job with multi-turn conversations is measured in turns (a three-turn conversation costs
    three generations): its ETA is the remaining turns at the turn rate.
    """

    multi_turn: bool
    total_turns: int
    done_turns: int
    window: tuple[float, float, float]  # samples, turns, tokens per second, the last minute
    since_start: tuple[float, float, float]  # the same since the start
    eta: float | None
    basis: str
    eta_by_tokens: float | None

    @classmethod
    def of(cls, snap: Snapshot, now: float, clock: Clock, avg_tokens: float | None) -> Pace:
        running = not clock.done_all
        win_samples = window_rate(snap.buckets, "samples", now, clock.started) if running else 0.0
        win_tokens = window_rate(snap.buckets, "tokens", now, clock.started) if running else 0.0
        multi_turn = snap.total_turns is not None and snap.total_turns != snap.total_samples
        total_turns = snap.total_samples if snap.total_turns is None else snap.total_turns
        done_turns = snap.done_samples if snap.done_turns is None else snap.done_turns
        win_turns = win_samples
        if multi_turn and running:
            win_turns = window_rate(snap.buckets, "turns", now, clock.started)
        start = (
            clock.per_second(snap.done_samples),
            clock.per_second(done_turns),
            clock.per_second(snap.stats.get("completion_tokens", 0.0)),
        )
        remaining = max(0, snap.total_samples - snap.done_samples)
        left, win, since = (
            (max(0, total_turns - done_turns), win_turns, start[1])
            if multi_turn
            else (remaining, win_samples, start[0])
        )
        basis, rate = ("last_minute", win) if win > 0 else ("since_start", since)
        tok_rate = win_tokens if win_tokens > 0 else start[2]
        by_tokens = eta_seconds(remaining * avg_tokens, tok_rate) if avg_tokens is not None else None
        if remaining == 0:
            by_tokens = 0.0
        window = (win_samples, win_turns, win_tokens)
        return cls(
            multi_turn, total_turns, done_turns, window, start, eta_seconds(left, rate), basis, by_tokens
        )

    def rates(self) -> RatesSection:
        """The document's ``rates`` section."""
        (samples, turns, tokens), (s0, t0, k0) = self.window, self.since_start
        return RatesSection(
            window_s=WINDOW_SECONDS,
            samples_per_s=round(samples, 3),
            turns_per_s=round(turns, 3),
            tokens_per_s=round(tokens, 1),
            since_start=RateFigures(round(s0, 3), round(t0, 3), round(k0, 1)),
        )

    def eta_fields(self, now: float) -> Eta:
        """The document's ``eta_*`` fields."""
        eta = self.eta
        return Eta(
            eta_s=rounded(eta, 0),
            eta_at_iso=_iso(now + eta) if eta else None,
            eta_basis=self.basis if eta else None,
            eta_unit="turns" if self.multi_turn else "samples",
            eta_by_tokens_s=rounded(self.eta_by_tokens, 0),
        )


def progress_document(snap: Snapshot, now: float, writer: str = "") -> ProgressDocument:
    """The progress document from a snapshot; no I/O."""
    clock = Clock.of(snap, now)
    failed = int(snap.stats.get("samples_failed", 0.0))
    counted_ok = snap.stats.get("samples_ok", 0.0)
    tokens = snap.stats.get("completion_tokens", 0.0)
    avg_tokens = tokens / counted_ok if counted_ok > 0 else None
    pace = Pace.of(snap, now, clock, avg_tokens)
    workers = worker_rows(snap, now)
    live = sum(1 for w in workers if w.alive)
    gpu_s = (
        num(snap.job.get("gpu_seconds")) if snap.settled else gpu_seconds(snap.job, live, now, clock.started)
    )
    spent, projected = cost(snap.gpu_hour_usd, gpu_s, live, pace.eta)
    return ProgressDocument(
        header=_header(snap, now, writer, clock),
        samples=_samples(snap, failed),
        turns=TurnsSection(
            total=pace.total_turns,
            done=pace.done_turns,
            remaining=max(0, pace.total_turns - pace.done_turns),
            generated=int(snap.stats.get("generations", 0.0)) or None,
        ),
        chunks=ChunksSection(
            total=snap.total_chunks,
            done=snap.done_chunks,
            running=snap.running_chunks,
            pending=max(0, snap.total_chunks - snap.done_chunks - snap.running_chunks),
        ),
        queue=snap.queue or None,
        queue_depth=snap.queue_depth,
        tokens=TokensSection(
            generated=int(tokens),
            prompt=int(snap.stats.get("prompt_tokens", 0.0)),
            avg_per_sample=rounded(avg_tokens, 1),
            counted_samples=int(counted_ok + failed),
        ),
        rates=pace.rates(),
        eta=pace.eta_fields(now),
        cost=CostSection(
            gpu_hour_usd=snap.gpu_hour_usd or None,
            gpus=live,
            gpu_hours=round(gpu_s / 3600.0, 4),
            usd=rounded(spent, 2),
            projected_total_usd=rounded(projected, 2),
        ),
        trainable_tokens=_trainable(snap.trainable),
        yield_section=yield_section(snap.stats, spent),
        sources=progress_sources(snap.staged_sources, snap.source_quality, spent),
        spec=spec_summary(snap, workers, now),
        workers=workers,
        counters=_counters(snap.stats),
        warnings=tuple(_warnings(snap, now, clock.done_all, live, counted_ok + failed)),
    )


def _header(snap: Snapshot, now: float, writer: str, clock: Clock) -> Header:
    """The job, its state, who wrote the document when, and the job's start, end and duration."""
    state = JobState.DONE if clock.done_all else JobState.parse(snap.job.get("state") or "")
    return Header(
        job_id=snap.job_id,
        output=snap.output,
        model=snap.model,
        state=state,
        pause_reason=(snap.job.get("pause_reason") or None) if state == JobState.PAUSED else None,
        updated_at=round(now, 3),
        updated_at_iso=_iso(now),
        writer=writer,
        started_at=clock.started,
        finished_at=clock.finished if clock.done_all else None,
        elapsed_s=rounded(clock.elapsed, 1),
    )


def _samples(snap: Snapshot, failed: int) -> SamplesSection:
    return SamplesSection(
        total=snap.total_samples,
        done=snap.done_samples,
        ok=max(0, snap.done_samples - failed),
        failed=failed,
        repaired=int(snap.stats.get("samples_repaired", 0.0)),
        remaining=max(0, snap.total_samples - snap.done_samples),
        invalid_lines=snap.invalid_lines,
    )


def _counters(stats: Mapping[str, float]) -> dict[str, float]:
    """The job's other counters (bookkeeping: repairs, requeues, ...), as Redis holds them."""
    return {
        k: v
        for k, v in stats.items()
        if not k.startswith(("samples_", "completion_", "prompt_", "spec_"))
        and k not in ("turns", "generations")
    }


def _warnings(snap: Snapshot, now: float, done_all: bool, live: int, counted: float) -> list[str]:
    """What a reader should know the figures lack: Redis, workers serving the model, lost counts."""
    warnings: list[str] = []
    if not snap.redis_ok:
        warnings.append("Redis unreachable: rates, running chunks and workers are unknown")
    elif not done_all:
        serving = serving_warning(snap.model, live_fleet({**snap.workers, **snap.fleet}, now))
        if serving:
            warnings.append(serving + f"; the job's chunks wait in queue {snap.queue or '?'}")
        elif live == 0:
            warnings.append("no live worker has touched this job in the last minute")
    warnings += snap.notes
    if snap.redis_ok and counted < snap.done_samples:
        warnings.append(
            f"token and failure counts cover {int(counted):,} of {snap.done_samples:,} stored samples "
            "(Redis lost its counters; the store is complete)"
        )
    return warnings


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


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def compute_document(
    store: Store,
    bookkeeping: Bookkeeping | None,
    job_id: str,
    now: float | None = None,
    *,
    queue: str = "",
    gpu_hour_usd: float | None = None,
    default_gpu_hour_usd: float = 0.0,
    writer: str = "",
) -> ProgressDocument:
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
    return progress_document(snap, now, writer)


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
