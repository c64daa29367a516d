"""What the progress of a job is computed from: a :class:`Snapshot` of the store and Redis.

Sources, by trust:

* the store: done chunks (one listing of ``outputs/``) and so done samples and turns; always the truth;
* Redis, ``bookkeeping``: live leases (running chunks), the exactly-once counters of stored
  chunks (failed samples, tokens), the job's state and pause reason;
* Redis, written by workers (:mod:`dflash_tasks.coord.progress_keys`): windowed rates, per-worker
  numbers, accept lengths.

Redis is read through :class:`dflash_tasks.coord.live_progress.LiveProgress`, in one pass.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.live_progress import LiveJob, LiveProgress
from dflash_tasks.coord.progress_keys import PROGRESS_KEY, window_bounds
from dflash_tasks.coord.routing import model_queue
from dflash_tasks.core.errors import ConfigError, DflashError, RetryableError, StoreError
from dflash_tasks.core.job import JobDefinition, Manifest
from dflash_tasks.core.source_quality import SOURCES_KEY
from dflash_tasks.core.trainable import TRAINABLE_KEY
from dflash_tasks.store import Store
from dflash_tasks.store.jobfiles import done_chunks, load_job, load_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What was read from the store and Redis at one instant."""

    job_id: str
    output: str
    model: str
    total_samples: int
    total_chunks: int
    invalid_lines: int
    done_chunks: int
    done_samples: int
    total_turns: int | None = None  # generations the job sends; None: one per sample
    done_turns: int | None = None  # of done chunks; None: one per sample
    running_chunks: int = 0
    queue: str = ""  # the job's model queue
    queue_depth: int | None = None
    job: Mapping[str, str] = field(default_factory=dict)  # the job hash
    stats: Mapping[str, float] = field(default_factory=dict)  # exactly-once counters of stored chunks
    per_worker: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # W -> cumulative counts
    workers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # W -> heartbeat hash
    fleet: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # every worker: W -> beat
    buckets: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # window bucket -> counts
    gpu_hour_usd: float = 0.0
    redis_ok: bool = True
    notes: tuple[str, ...] = ()  # extra warnings
    #: A finished job whose figures are final (monitoring.settled): its time never runs on.
    settled: bool = False
    trainable: Mapping[str, Any] | None = None  # the latest trainable.json (loss-token count)
    staged_sources: list[dict[str, Any]] | None = None  # per input source, as staged (manifest)
    source_quality: Mapping[str, Any] | None = None  # the latest sources.json (report's figures)


def read_snapshot(
    store: Store,
    bookkeeping: Bookkeeping | None,
    job_id: str,
    now: float,
    *,
    queue: str = "",
    manifest: Manifest | None = None,
    definition: JobDefinition | None = None,
    gpu_hour_usd: float | None = None,
    default_gpu_hour_usd: float = 0.0,
) -> Snapshot:
    """Read the store (done chunks) and, if reachable, Redis (everything else).

    ``queue`` is the base queue: the depth shown is that of the job's model queue.
    ``gpu_hour_usd`` (a flag) wins over the price the job recorded, which wins over
    ``default_gpu_hour_usd`` (a setting). Raises :class:`StoreError` if the job is not staged.
    """
    definition = definition or load_job(store)
    manifest = manifest or load_manifest(store)
    if definition is None or manifest is None:
        raise StoreError(f"{store.uri} holds no staged job (no job.json / manifest.json yet)")
    done = {c for c in done_chunks(store) if c < manifest.chunks}
    try:
        job_queue = model_queue(queue, definition.spec.model) if queue else ""
    except ConfigError:  # a hand-written job.json with an unroutable model
        job_queue = ""
    snap = Snapshot(
        job_id=job_id,
        output=store.uri,
        model=definition.spec.model,
        total_samples=manifest.samples,
        total_chunks=manifest.chunks,
        invalid_lines=manifest.invalid,
        done_chunks=len(done),
        done_samples=sum(manifest.chunk_samples(c) for c in done),
        queue=job_queue,
        total_turns=manifest.turns,
        done_turns=None if manifest.turns is None else sum(manifest.turns_of(c) for c in done),
        redis_ok=False,
        gpu_hour_usd=gpu_hour_usd if gpu_hour_usd is not None else default_gpu_hour_usd,
        trainable=read_trainable(store),
        staged_sources=manifest.sources,
        source_quality=read_trainable(store, SOURCES_KEY) if manifest.sources else None,
    )
    if bookkeeping is None:
        return snap
    try:
        live = LiveProgress.of(bookkeeping).read_job(job_id, now, window_bounds(now), job_queue)
    except RetryableError as exc:
        log.warning("progress of job %s without Redis: %s", job_id, exc)
        return snap
    snap = _with_live(snap, live, done)
    if gpu_hour_usd is None and num(snap.job.get("gpu_hour_usd")) > 0:
        snap = replace(snap, gpu_hour_usd=num(snap.job.get("gpu_hour_usd")))
    return snap


def _with_live(snap: Snapshot, live: LiveJob, done: set[int]) -> Snapshot:
    """``snap`` with what Redis holds: its strings as numbers, its running chunks not yet stored."""
    return replace(
        snap,
        running_chunks=len(live.leased - done),
        queue_depth=live.queue_depth,
        job=live.job,
        stats={k: num(v) for k, v in live.stats.items()},
        per_worker={name: {k: num(v) for k, v in counts.items()} for name, counts in live.per_worker.items()},
        workers=live.workers,
        fleet=live.fleet,
        buckets={b: {k: num(v) for k, v in row.items()} for b, row in live.buckets.items()},
        redis_ok=True,
    )


def num(value: object) -> float:
    """A Redis field as a finite float; 0.0 when it is absent, not a number or not finite."""
    try:
        x = float(cast(Any, value))
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def read_trainable(store: Store, key: str = TRAINABLE_KEY) -> dict[str, Any] | None:
    """The latest loss-token count (``trainable.json``, or another such file of ``report``'s), or
    None if there is none (or it is unreadable)."""
    try:
        doc = json.loads(store.read(key))
    except (KeyError, ValueError, DflashError):
        return None
    return doc if isinstance(doc, dict) else None


def read_progress(store: Store) -> dict[str, Any] | None:
    """The last ``progress.json``, or None if there is none (or it is unreadable)."""
    try:
        doc = json.loads(store.read(PROGRESS_KEY))
    except (KeyError, ValueError, DflashError):
        return None
    return doc if isinstance(doc, dict) else None
