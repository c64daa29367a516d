"""Live progress of a job: the numbers behind ``progress.json`` and ``python -m dflash_tasks.status``.

Data path. Every worker counts the samples it finishes in memory and pushes the counts to Redis
every couple of seconds (:mod:`dflash_tasks.monitor`), together with a heartbeat of its own
state. Any live process (each worker, ``enqueue --wait``) then tries, every ``progress_seconds``,
to take a short per-job lock; the one that gets it computes the job's progress here and writes
``progress.json`` at the output root. ``status`` computes the same document with the same code,
so the two never disagree. Nothing depends on the producer staying up.

Sources, by trust:

* the store: done chunks (one listing of ``outputs/``) and so done samples; always the truth;
* Redis, ``bookkeeping``: live leases (running chunks), the exactly-once counters of stored
  chunks (failed samples, tokens), the job's state and pause reason;
* Redis, written by workers (below): windowed rates, per-worker numbers, accept lengths.

Keys (``P`` the prefix, ``J`` a job id, ``W`` a worker's hostname, ``T`` a unix time)::

    P:job:J                 hash (the bookkeeping job hash) + started_at, finished_at,
                            gpu_seconds, gpu_tick, gpu_hour_usd, progress_final
    P:job:J:workers         hash "W|samples", "W|failed", "W|tokens", "W|chunks", "W|first"
    P:job:J:rate:T          hash per 5-second bucket starting at T: samples, failed, tokens,
                            "W|samples", "W|tokens"; expires after 15 minutes
    P:worker:W              hash: endpoint, last_seen, beat_s, inflight, waiting, max_inflight,
                            held_chunks, healthy, spec_accept_length
    P:lock:progress:J       the writer lock (one writer per period)

Losing these keys loses only history: rates rebuild within a minute; ``started_at`` and the
GPU time are re-seeded from the last ``progress.json``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

import redis

from dflash_tasks.bookkeeping import Bookkeeping
from dflash_tasks.errors import DflashError, StoreError
from dflash_tasks.job import JobDefinition, Manifest, done_chunks, load_job, load_manifest
from dflash_tasks.store import Store

log = logging.getLogger(__name__)

PROGRESS_KEY = "progress.json"
FORMAT_VERSION = 1
#: Width of a rate bucket (s).
BUCKET_SECONDS = 5
#: The "last minute" of windowed rates (s).
WINDOW_SECONDS = 60
#: Rate buckets expire after this long (s).
BUCKET_TTL = 15 * 60
#: Workers push their counts at least this often (s); the window ends this long before now.
FLUSH_LAG = 2.5
#: Writers keep refreshing a done job's progress.json this long (s), so that the workers'
#: last counts land in it; then it is final and nobody writes it again.
FINAL_AFTER = 3 * FLUSH_LAG
#: A worker is alive while its last heartbeat is younger than max(ALIVE_MIN, 4 heartbeats) (s).
ALIVE_MIN = 15.0
#: The longest gap between two GPU-time ticks that is still billed (s): a gap longer than this
#: means nobody was watching (every process down), and is not counted.
GPU_GAP_CAP = 60.0
#: Redis hashes expire after this long without a write (s).
WORKER_TTL = 24 * 3600

# HSET field to value if it is absent or larger (an "earliest time" register).
SET_MIN_SCRIPT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (not cur) or tonumber(ARGV[2]) < tonumber(cur) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


class Keys:
    """Names of the progress keys under one prefix (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def stats(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:stats"

    def leases(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:leases"

    def job_workers(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:workers"

    def bucket(self, job_id: str, start: int) -> str:
        return f"{self.prefix}:job:{job_id}:rate:{start}"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"


def bucket_start(t: float) -> int:
    return int(t // BUCKET_SECONDS) * BUCKET_SECONDS


def window_bounds(now: float) -> tuple[int, int]:
    """[start, end) of the rate window: the last full minute of buckets that every worker flushed."""
    end = bucket_start(now - FLUSH_LAG)
    return end - WINDOW_SECONDS, end


def queue_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue`` (one per priority step; unprioritised = the name)."""
    return [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]


# --- the snapshot: everything progress is computed from ---------------------------------------


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
    running_chunks: int = 0
    queue_depth: int | None = None
    job: Mapping[str, str] = field(default_factory=dict)  # the job hash
    stats: Mapping[str, float] = field(default_factory=dict)  # exactly-once counters of stored chunks
    per_worker: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # W -> cumulative counts
    workers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # W -> heartbeat hash
    buckets: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # window bucket -> counts
    gpu_hour_usd: float = 0.0
    redis_ok: bool = True
    notes: tuple[str, ...] = ()  # extra warnings


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

    ``gpu_hour_usd`` (a flag) wins over the price the job recorded, which wins over
    ``default_gpu_hour_usd`` (a setting). Raises :class:`StoreError` if the job is not staged.
    """
    definition = definition or load_job(store)
    manifest = manifest or load_manifest(store)
    if definition is None or manifest is None:
        raise StoreError(f"{store.uri} holds no staged job (no job.json / manifest.json yet)")
    done = {c for c in done_chunks(store) if c < manifest.chunks}
    snap = Snapshot(
        job_id=job_id,
        output=store.uri,
        model=definition.spec.model,
        total_samples=manifest.samples,
        total_chunks=manifest.chunks,
        invalid_lines=manifest.invalid,
        done_chunks=len(done),
        done_samples=sum(manifest.chunk_samples(c) for c in done),
        redis_ok=False,
        gpu_hour_usd=gpu_hour_usd if gpu_hour_usd is not None else default_gpu_hour_usd,
    )
    if bookkeeping is None:
        return snap
    try:
        snap = _read_redis(snap, bookkeeping.client, Keys(bookkeeping.prefix), done, now, queue)
    except redis.RedisError as exc:
        log.warning("progress of job %s without Redis: %s", job_id, exc)
        return snap
    if gpu_hour_usd is None and _num(snap.job.get("gpu_hour_usd")) > 0:
        snap = replace(snap, gpu_hour_usd=_num(snap.job.get("gpu_hour_usd")))
    return snap


def _read_redis(
    snap: Snapshot, r: redis.Redis, keys: Keys, done: set[int], now: float, queue: str
) -> Snapshot:
    job_id = snap.job_id
    start, end = window_bounds(now)
    starts = list(range(start, end, BUCKET_SECONDS))
    qkeys = queue_keys(queue) if queue else []
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.job(job_id))
    pipe.hgetall(keys.stats(job_id))
    pipe.hgetall(keys.job_workers(job_id))
    pipe.zrangebyscore(keys.leases(job_id), now, "+inf")
    for b in starts:
        pipe.hgetall(keys.bucket(job_id, b))
    for q in qkeys:
        pipe.llen(q)
    res = pipe.execute()
    job_hash, stats, per_worker_raw, leased = res[0], res[1], res[2], res[3]
    bucket_rows = res[4 : 4 + len(starts)]
    lengths = res[4 + len(starts) :]
    per_worker: dict[str, dict[str, float]] = {}
    for raw_field, raw_value in _decoded(per_worker_raw).items():
        name, _, what = raw_field.rpartition("|")
        if name:
            per_worker.setdefault(name, {})[what] = _num(raw_value)
    pipe = r.pipeline(transaction=False)
    names = sorted(per_worker)
    for name in names:
        pipe.hgetall(keys.worker(name))
    workers = {name: _decoded(row) for name, row in zip(names, pipe.execute(), strict=True) if row}
    running = {int(m) for m in cast(list[bytes], leased)} - done
    return replace(
        snap,
        running_chunks=len(running),
        queue_depth=sum(int(n) for n in lengths) if qkeys else None,
        job=_decoded(job_hash),
        stats={k: _num(v) for k, v in _decoded(stats).items()},
        per_worker=per_worker,
        workers=workers,
        buckets={
            b: {k: _num(v) for k, v in _decoded(row).items()}
            for b, row in zip(starts, bucket_rows, strict=True)
            if row
        },
        redis_ok=True,
    )


def _decoded(raw: Any) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in cast(Mapping[Any, Any], raw or {}).items()
    }


def _num(value: object) -> float:
    try:
        x = float(cast(Any, value))
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


# --- the math (pure) --------------------------------------------------------------------------


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


def alive(worker: Mapping[str, str], now: float) -> bool:
    """Whether a worker's last heartbeat is recent."""
    beat = _num(worker.get("beat_s")) or 2.0
    return now - _num(worker.get("last_seen")) <= max(ALIVE_MIN, 4 * beat)


def gpu_seconds(job: Mapping[str, str], live_gpus: int, now: float, started_at: float | None) -> float:
    """GPU time spent: the ticks written so far, plus the live GPUs since the last tick.

    Without ticks (no writer has run yet) it is ``live_gpus * elapsed``.
    """
    tick = _num(job.get("gpu_tick"))
    if job.get("finished_at"):
        return _num(job.get("gpu_seconds"))
    if tick > 0:
        return _num(job.get("gpu_seconds")) + live_gpus * min(max(0.0, now - tick), GPU_GAP_CAP)
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
    started = _num(job.get("started_at")) or None
    finished = _num(job.get("finished_at")) or None
    end = finished if (done_all and finished) else now
    elapsed = max(0.0, end - started) if started else None

    failed = int(snap.stats.get("samples_failed", 0.0))
    counted_ok = snap.stats.get("samples_ok", 0.0)
    tokens = snap.stats.get("completion_tokens", 0.0)
    avg_tokens = tokens / counted_ok if counted_ok > 0 else None
    remaining = max(0, snap.total_samples - snap.done_samples)

    win_samples = window_rate(snap.buckets, "samples", now, started) if not done_all else 0.0
    win_tokens = window_rate(snap.buckets, "tokens", now, started) if not done_all else 0.0
    start_samples = snap.done_samples / elapsed if elapsed else 0.0
    start_tokens = tokens / elapsed if elapsed else 0.0
    basis, rate = ("last_minute", win_samples) if win_samples > 0 else ("since_start", start_samples)
    eta = eta_seconds(remaining, rate)
    tok_rate = win_tokens if win_tokens > 0 else start_tokens
    eta_tokens = eta_seconds(remaining * avg_tokens, tok_rate) if avg_tokens is not None else None
    if remaining == 0:
        eta_tokens = 0.0

    workers = _workers(snap, now)
    live = sum(1 for w in workers if w["alive"])
    gpu_s = gpu_seconds(job, live, now, started)
    spent, projected = cost(snap.gpu_hour_usd, gpu_s, live, eta)
    accepts = [w["spec_accept_length"] for w in workers if w["alive"] and w["spec_accept_length"]]

    state = "done" if done_all else (job.get("state") or "running")
    warnings: list[str] = []
    if not snap.redis_ok:
        warnings.append("Redis unreachable: rates, running chunks and workers are unknown")
    elif not done_all and live == 0:
        warnings.append("no live worker has touched this job in the last minute")
    counted = counted_ok + failed
    warnings += snap.notes
    if snap.redis_ok and counted < snap.done_samples:
        warnings.append(
            f"token and failure counts cover {int(counted):,} of {snap.done_samples:,} stored samples "
            "(Redis lost its counters; the store is complete)"
        )
    counters = {
        k: v for k, v in snap.stats.items() if not k.startswith(("samples_", "completion_", "prompt_"))
    }
    return {
        "version": FORMAT_VERSION,
        "job_id": snap.job_id,
        "output": snap.output,
        "model": snap.model,
        "state": state,
        "pause_reason": (job.get("pause_reason") or None) if state == "paused" else None,
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
            "failed": failed,
            "remaining": remaining,
            "invalid_lines": snap.invalid_lines,
        },
        "chunks": {
            "total": snap.total_chunks,
            "done": snap.done_chunks,
            "running": snap.running_chunks,
            "pending": max(0, snap.total_chunks - snap.done_chunks - snap.running_chunks),
        },
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
            "tokens_per_s": round(win_tokens, 1),
            "since_start": {"samples_per_s": round(start_samples, 3), "tokens_per_s": round(start_tokens, 1)},
        },
        "eta_s": _round(eta, 0),
        "eta_at_iso": _iso(now + eta) if eta else None,
        "eta_basis": basis if eta else None,
        "eta_by_tokens_s": _round(eta_tokens, 0),
        "cost": {
            "gpu_hour_usd": snap.gpu_hour_usd or None,
            "gpus": live,
            "gpu_hours": round(gpu_s / 3600.0, 4),
            "usd": _round(spent, 2),
            "projected_total_usd": _round(projected, 2),
        },
        "spec_accept_length": _round(sum(accepts) / len(accepts), 3) if accepts else None,
        "workers": workers,
        "counters": counters,
        "warnings": warnings,
    }


def _workers(snap: Snapshot, now: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in sorted(snap.per_worker):
        counts = snap.per_worker[name]
        beat = snap.workers.get(name, {})
        first = counts.get("first") or None
        accept = _num(beat.get("spec_accept_length")) or None
        rows.append(
            {
                "name": name,
                "endpoint": beat.get("endpoint", ""),
                "alive": bool(beat) and alive(beat, now),
                "last_seen_s": _round(now - _num(beat.get("last_seen")), 1) if beat else None,
                "healthy": beat.get("healthy") == "1" if beat else None,
                "samples": int(counts.get("samples", 0.0)),
                "failed": int(counts.get("failed", 0.0)),
                "tokens": int(counts.get("tokens", 0.0)),
                "chunks": int(counts.get("chunks", 0.0)),
                "samples_per_s": round(window_rate(snap.buckets, f"{name}|samples", now, first), 3),
                "tokens_per_s": round(window_rate(snap.buckets, f"{name}|tokens", now, first), 1),
                "inflight": int(_num(beat.get("inflight"))),
                "waiting": int(_num(beat.get("waiting"))),
                "max_inflight": int(_num(beat.get("max_inflight"))),
                "held_chunks": int(_num(beat.get("held_chunks"))),
                "spec_accept_length": _round(accept, 3),
            }
        )
    return rows


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
        if previous and previous.get("job_id") == job_id:
            snap = carry_over(snap, previous)
    return summarize(snap, now, writer)


def carry_over(snap: Snapshot, previous: Mapping[str, Any]) -> Snapshot:
    """Fill what Redis cannot tell (it is unreachable, or lost its keys) from the last progress.json."""
    job = dict(snap.job)
    if previous.get("started_at") and not job.get("started_at"):
        job["started_at"] = str(previous["started_at"])
    if snap.redis_ok:
        return replace(snap, job=job)
    samples, tokens, cost_doc = (previous.get(k) or {} for k in ("samples", "tokens", "cost"))
    if previous.get("finished_at"):
        job["finished_at"] = str(previous["finished_at"])
    job.update(
        gpu_seconds=str(_num(cost_doc.get("gpu_hours")) * 3600.0), gpu_tick=str(previous["updated_at"])
    )
    failed = _num(samples.get("failed"))
    stats = {
        **{k: _num(v) for k, v in (previous.get("counters") or {}).items()},
        "samples_ok": _num(tokens.get("counted_samples")) - failed,
        "samples_failed": failed,
        "completion_tokens": _num(tokens.get("generated")),
        "prompt_tokens": _num(tokens.get("prompt")),
    }
    note = f"counts other than done chunks are from progress.json of {previous.get('updated_at_iso')}"
    price = snap.gpu_hour_usd or _num(cost_doc.get("gpu_hour_usd"))
    return replace(snap, job=job, stats=stats, notes=(*snap.notes, note), gpu_hour_usd=price)


def read_progress(store: Store) -> dict[str, Any] | None:
    """The last ``progress.json``, or None if there is none (or it is unreadable)."""
    try:
        doc = json.loads(store.read(PROGRESS_KEY))
    except (KeyError, ValueError, DflashError):
        return None
    return doc if isinstance(doc, dict) else None


def record_gpu_price(bookkeeping: Bookkeeping, job_id: str, gpu_hour_usd: float) -> None:
    """Record the job's price per GPU-hour, so every writer (and ``status``) prices it alike."""
    if gpu_hour_usd > 0:
        try:
            bookkeeping.client.hset(Keys(bookkeeping.prefix).job(job_id), "gpu_hour_usd", gpu_hour_usd)
        except redis.RedisError as exc:
            log.warning("could not record the GPU price of job %s: %s", job_id, exc)


# --- writing progress.json --------------------------------------------------------------------


class ProgressWriter:
    """Writes ``progress.json`` for a job at most about once per ``period`` across all processes.

    Every live process may call :meth:`write_if_due` every period: the one that takes the job's
    short Redis lock computes the document, bills the GPU time since the last tick, and writes it.
    """

    def __init__(
        self,
        bookkeeping: Bookkeeping,
        owner: str,
        period: float,
        queue: str = "",
        default_gpu_hour_usd: float = 0.0,
    ) -> None:
        self._bk = bookkeeping
        self._keys = Keys(bookkeeping.prefix)
        self._owner = owner
        self._period = period
        self._queue = queue
        self._price = default_gpu_hour_usd
        self._set_min = bookkeeping.client.register_script(SET_MIN_SCRIPT)

    def write_if_due(
        self,
        job_id: str,
        store: Store,
        manifest: Manifest | None = None,
        definition: JobDefinition | None = None,
        now: float | None = None,
    ) -> dict[str, Any] | None:
        """Write the job's progress if no other process did within the period; the document or None."""
        if not self._bk.try_lock(f"progress:{job_id}", self._owner, max(self._period * 0.9, 0.2)):
            return None
        return self.write(job_id, store, manifest, definition, now)

    def write(
        self,
        job_id: str,
        store: Store,
        manifest: Manifest | None = None,
        definition: JobDefinition | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Compute, bill GPU time, and write ``progress.json`` now (the caller holds the lock)."""
        now = time.time() if now is None else now
        r = self._bk.client
        try:
            if not r.hexists(self._keys.job(job_id), "gpu_tick"):  # a new job, or Redis lost its keys
                self._seed(job_id, store)
        except redis.RedisError as exc:
            log.debug("could not seed progress of job %s: %s", job_id, exc)
        snap = read_snapshot(
            store,
            self._bk,
            job_id,
            now,
            queue=self._queue,
            manifest=manifest,
            definition=definition,
            default_gpu_hour_usd=self._price,
        )
        if snap.redis_ok:
            try:
                snap = self._tick(r, snap, now)
            except redis.RedisError as exc:
                log.debug("could not bill GPU time of job %s: %s", job_id, exc)
        doc = summarize(snap, now, self._owner)
        store.write(PROGRESS_KEY, (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode())
        settled = now - (doc["finished_at"] or now) >= FINAL_AFTER  # late worker counts have landed
        if doc["state"] == "done" and snap.redis_ok and settled:
            try:
                r.hset(self._keys.job(job_id), "progress_final", "1")
            except redis.RedisError as exc:
                log.debug("could not mark the progress of job %s final: %s", job_id, exc)
        return doc

    def _seed(self, job_id: str, store: Store) -> None:
        """After a Redis loss, carry the start time, GPU time and price over from the last document."""
        previous = read_progress(store)
        if not previous or previous.get("job_id") != job_id:
            return
        key = self._keys.job(job_id)
        if previous.get("started_at"):
            self._set_min(keys=[key], args=["started_at", previous["started_at"]])
        cost_doc = previous.get("cost") or {}
        pipe = self._bk.client.pipeline()
        if isinstance(cost_doc, dict):
            pipe.hsetnx(key, "gpu_seconds", float(cost_doc.get("gpu_hours") or 0.0) * 3600.0)
            if cost_doc.get("gpu_hour_usd"):
                pipe.hsetnx(key, "gpu_hour_usd", cost_doc["gpu_hour_usd"])
        pipe.hsetnx(key, "gpu_tick", previous.get("updated_at") or time.time())
        pipe.execute()

    def _tick(self, r: redis.Redis, snap: Snapshot, now: float) -> Snapshot:
        """Bill ``live GPUs * time since the last tick`` and, once done, stamp ``finished_at``."""
        job = dict(snap.job)
        if job.get("finished_at"):
            return snap
        key = self._keys.job(snap.job_id)
        live = sum(1 for name in snap.per_worker if alive(snap.workers.get(name, {}), now))
        last = _num(job.get("gpu_tick")) or _num(job.get("started_at"))
        billed = live * min(max(0.0, now - last), GPU_GAP_CAP) if last else 0.0
        pipe = r.pipeline()
        pipe.hincrbyfloat(key, "gpu_seconds", billed)
        pipe.hset(key, "gpu_tick", now)
        if snap.done_chunks >= snap.total_chunks:
            pipe.hsetnx(key, "finished_at", now)
        pipe.hgetall(key)
        job = _decoded(pipe.execute()[-1])
        return replace(snap, job=job)


def job_needs_progress(bookkeeping: Bookkeeping, job_id: str) -> bool:
    """False once a job's final (done) ``progress.json`` was written."""
    return not bookkeeping.job_info(job_id).get("progress_final")


def registered_jobs(bookkeeping: Bookkeeping) -> Iterable[str]:
    """Registered jobs still in progress (best effort: empty when Redis is unreachable)."""
    try:
        return [j for j in bookkeeping.jobs() if job_needs_progress(bookkeeping, j)]
    except DflashError as exc:
        log.debug("cannot list jobs: %s", exc)
        return []
