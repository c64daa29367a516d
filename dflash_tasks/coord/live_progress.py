"""The live-progress keys in Redis: what workers push, what ``progress.json`` is computed from.

:class:`LiveProgress` is the one way to them. Workers push their counter deltas, rate buckets
and heartbeat (:meth:`LiveProgress.push`); the progress snapshot reads a job's counters,
buckets, leases and workers (:meth:`LiveProgress.read_job`); the ``progress.json`` writer bills
GPU time (:meth:`LiveProgress.bill_gpu`) and re-seeds it after a Redis loss; the Prometheus
gauge reads queue depths (:meth:`LiveProgress.queue_depths`).

Values come back as decoded strings: what they mean (numbers, rates) is the reader's business.
Every method raises :class:`~dflash_tasks.core.errors.RetryableError` on a Redis error.

Key names: :mod:`dflash_tasks.coord.keys`; bucket widths and windows:
:mod:`dflash_tasks.coord.progress_keys`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping, read_heartbeats
from dflash_tasks.coord.connection import redis_errors
from dflash_tasks.coord.keys import Keys, queue_keys
from dflash_tasks.coord.lua import load_script
from dflash_tasks.coord.progress_keys import BUCKET_SECONDS

#: Rate buckets expire after this long (s).
BUCKET_TTL = 15 * 60
#: Redis hashes expire after this long without a write (s).
WORKER_TTL = 24 * 3600

#: A field's value as a worker writes it into its heartbeat hash.
Field = str | float | int
#: str -> str: a decoded Redis hash.
Hash = dict[str, str]


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A job's live keys, read in one pass (:meth:`LiveProgress.read_job`)."""

    job: Hash  # the job hash (state, started_at, gpu_seconds, gpu_tick, ...)
    stats: Hash  # the exactly-once counters of stored chunks
    per_worker: dict[str, Hash]  # W -> its cumulative counts for the job ("W|what" split)
    workers: dict[str, Hash]  # the heartbeats of the workers in per_worker that still have one
    fleet: dict[str, Hash]  # every registered worker's heartbeat
    leased: frozenset[int]  # chunks with a live lease
    buckets: dict[int, Hash] = field(default_factory=dict)  # bucket start -> counts (non-empty ones)
    queue_depth: int | None = None  # messages waiting in the queue asked for; None: none asked


class LiveProgress:
    """The boundary to the live-progress keys (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._set_min = load_script(client, "set_min")

    @classmethod
    def of(cls, bookkeeping: Bookkeeping) -> LiveProgress:
        """The live progress under ``bookkeeping``'s prefix, on its client."""
        return cls(bookkeeping.client, bookkeeping.prefix)

    # -- workers write ------------------------------------------------------------------------------
    def push(
        self,
        worker: str,
        buckets: Mapping[tuple[str, int], Mapping[str, int]],
        totals: Mapping[str, Mapping[str, int]],
        first: Mapping[str, float],
        heartbeat: Mapping[str, Field],
    ) -> None:
        """One round trip: add a worker's counts and write its heartbeat.

        ``buckets``: (job, bucket start) -> counts to add to the job's rate bucket;
        ``totals``: job -> counts to add to the worker's cumulative ``W|name`` fields;
        ``first``: job -> when the worker started its first chunk (kept if earlier than the
        recorded one, and the job's ``started_at`` likewise); ``heartbeat``: the worker's hash.
        """
        k = self._keys
        with redis_errors("pushing live stats"):
            pipe = self._r.pipeline(transaction=False)
            for (job_id, start), counts in buckets.items():
                key = k.bucket(job_id, start)
                for name, n in counts.items():
                    pipe.hincrby(key, name, n)
                pipe.expire(key, BUCKET_TTL)
            for job_id, counts in totals.items():
                for name, n in counts.items():
                    pipe.hincrby(k.job_workers(job_id), f"{worker}|{name}", n)
            for job_id, t in first.items():
                self._set_min(keys=[k.job_workers(job_id)], args=[f"{worker}|first", t], client=pipe)
                self._set_min(keys=[k.job(job_id)], args=["started_at", t], client=pipe)
            pipe.hset(k.worker(worker), mapping=cast(Any, dict(heartbeat)))
            pipe.expire(k.worker(worker), WORKER_TTL)
            pipe.sadd(k.workers(), worker)
            pipe.expire(k.workers(), WORKER_TTL)
            pipe.execute()

    # -- the progress snapshot reads --------------------------------------------------------------
    def read_job(self, job_id: str, now: float, window: tuple[int, int], queue: str = "") -> LiveJob:
        """The job's live keys at ``now``: its buckets starting in ``window`` (``[start, end)``)
        and, when ``queue`` is given, the depth of that queue."""
        k = self._keys
        starts = list(range(window[0], window[1], BUCKET_SECONDS))
        qkeys = queue_keys(queue) if queue else []
        with redis_errors("reading the job's live progress"):
            pipe = self._r.pipeline(transaction=False)
            pipe.hgetall(k.job(job_id))
            pipe.hgetall(k.stats(job_id))
            pipe.hgetall(k.job_workers(job_id))
            pipe.zrangebyscore(k.leases(job_id), now, "+inf")
            for b in starts:
                pipe.hgetall(k.bucket(job_id, b))
            for q in qkeys:
                pipe.llen(q)
            res = pipe.execute()
            job_hash, stats, per_worker_raw, leased = res[0], res[1], res[2], res[3]
            bucket_rows = res[4 : 4 + len(starts)]
            lengths = res[4 + len(starts) :]
            per_worker: dict[str, Hash] = {}
            for raw_field, raw_value in decode_hash(per_worker_raw).items():
                name, _, what = raw_field.rpartition("|")
                if name:
                    per_worker.setdefault(name, {})[what] = raw_value
            pipe = self._r.pipeline(transaction=False)
            names = sorted(per_worker)
            for name in names:
                pipe.hgetall(k.worker(name))
            workers = {name: decode_hash(row) for name, row in zip(names, pipe.execute(), strict=True) if row}
            fleet = read_heartbeats(self._r, k)
        return LiveJob(
            job=decode_hash(job_hash),
            stats=decode_hash(stats),
            per_worker=per_worker,
            workers=workers,
            fleet=fleet,
            leased=frozenset(int(m) for m in cast(list[bytes], leased)),
            buckets={b: decode_hash(row) for b, row in zip(starts, bucket_rows, strict=True) if row},
            queue_depth=sum(int(n) for n in lengths) if qkeys else None,
        )

    def queue_depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting in each of ``queues`` (all its priority lists), in one round trip."""
        queues = list(queues)
        with redis_errors("reading queue depths"):
            pipe = self._r.pipeline(transaction=False)
            for queue in queues:
                for key in queue_keys(queue):
                    pipe.llen(key)
            lengths = [int(n) for n in pipe.execute()]
        per = len(lengths) // len(queues) if queues else 0
        return {queue: sum(lengths[i * per : (i + 1) * per]) for i, queue in enumerate(queues)}

    # -- the progress.json writer bills GPU time ----------------------------------------------------
    def has_gpu_clock(self, job_id: str) -> bool:
        """True once the job's GPU time is being billed (False for a new job, or after a Redis loss)."""
        with redis_errors("reading the job's GPU clock"):
            return bool(self._r.hexists(self._keys.job(job_id), "gpu_tick"))

    def seed_gpu_clock(
        self,
        job_id: str,
        gpu_tick: float,
        started_at: float | None = None,
        gpu_seconds: float | None = None,
        gpu_hour_usd: float | None = None,
    ) -> None:
        """Carry the start time, GPU time and price over (from the last ``progress.json``).

        ``started_at`` is kept if earlier than the recorded one; the other fields only fill in
        what is missing. ``None`` (or a zero ``started_at``/``gpu_hour_usd``) leaves a field alone.
        """
        key = self._keys.job(job_id)
        with redis_errors("seeding the job's GPU clock"):
            if started_at:
                self._set_min(keys=[key], args=["started_at", started_at])
            pipe = self._r.pipeline()
            if gpu_seconds is not None:
                pipe.hsetnx(key, "gpu_seconds", gpu_seconds)
            if gpu_hour_usd:
                pipe.hsetnx(key, "gpu_hour_usd", gpu_hour_usd)
            pipe.hsetnx(key, "gpu_tick", gpu_tick)
            pipe.execute()

    def bill_gpu(self, job_id: str, gpu_seconds: float, now: float, finished: bool) -> Hash:
        """Add ``gpu_seconds``, move the GPU clock to ``now`` and, if ``finished``, stamp
        ``finished_at`` (once), atomically; returns the job hash afterwards."""
        key = self._keys.job(job_id)
        with redis_errors("billing GPU time"):
            pipe = self._r.pipeline()
            pipe.hincrbyfloat(key, "gpu_seconds", gpu_seconds)
            pipe.hset(key, "gpu_tick", now)
            if finished:
                pipe.hsetnx(key, "finished_at", now)
            pipe.hgetall(key)
            return decode_hash(pipe.execute()[-1])

    def set_gpu_price(self, job_id: str, gpu_hour_usd: float) -> None:
        """Record the job's price per GPU-hour (every writer and ``status`` price it alike)."""
        with redis_errors("recording the GPU price"):
            self._r.hset(self._keys.job(job_id), "gpu_hour_usd", gpu_hour_usd)

    def mark_progress_final(self, job_id: str) -> None:
        """Record that the job's final ``progress.json`` was written (nobody writes it again)."""
        with redis_errors("marking the progress final"):
            self._r.hset(self._keys.job(job_id), "progress_final", "1")


def decode_hash(raw: Any) -> Hash:
    """A Redis hash (bytes or str keys and values) as str -> str."""
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in cast(Mapping[Any, Any], raw or {}).items()
    }
