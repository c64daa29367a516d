"""Redis bookkeeping: the job registry, chunk leases, done markers and counters.

Redis only speeds things up and coordinates live workers; the store stays the truth. Losing
every key here (a fresh Redis, FLUSHALL) costs no data: re-running enqueue rebuilds it.

Key names: :mod:`dflash_tasks.coord.keys`; the Lua scripts: ``dflash_tasks/coord/lua/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

import redis

from dflash_tasks.coord.connection import connect, redis_errors
from dflash_tasks.coord.keys import Keys
from dflash_tasks.coord.lua import load_script
from dflash_tasks.coord.progress_keys import BUCKET_SECONDS
from dflash_tasks.coord.publish import UnackedDelivery, unacked_deliveries
from dflash_tasks.core.states import JobState


class Bookkeeping:
    """The boundary to the bookkeeping keys in Redis; Redis errors become :class:`RetryableError`."""

    def __init__(self, client: redis.Redis, prefix: str = "dflash") -> None:
        self._r = client
        self._p = prefix
        self._keys = Keys(prefix)
        self._acquire = load_script(client, "acquire_lease")
        self._complete = load_script(client, "complete_chunk")
        self._complete_repair = load_script(client, "complete_repair")
        self._release = load_script(client, "release_lease")
        self._claim = load_script(client, "claim_expired_lease")
        self._renew = load_script(client, "renew_leases")

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "dflash",
        *,
        timeout: float = 30,
        connect_timeout: float = 10,
        health_check_interval: int = 25,
    ) -> Bookkeeping:
        """Bookkeeping on a new client of the Redis at ``url`` (see :func:`connection.connect`)."""
        client = connect(
            url, timeout=timeout, connect_timeout=connect_timeout, health_check_interval=health_check_interval
        )
        return cls(client, prefix)

    @property
    def client(self) -> redis.Redis:
        return self._r

    @property
    def prefix(self) -> str:
        """The key prefix (``P`` above); other modules name their own keys under it."""
        return self._p

    def ping(self) -> None:
        """Raise :class:`RetryableError` (naming the host, not the password) if Redis is unreachable."""
        with redis_errors("connecting to the broker"):
            self._r.ping()

    def _k(self, job_id: str, what: str = "") -> str:
        return self._keys.job(job_id, what)

    # -- job registry ---------------------------------------------------------------------------
    def register_job(self, job_id: str, output_uri: str) -> None:
        """Make the job known to workers (they look up its output location here)."""
        with redis_errors("registering the job"):
            pipe = self._r.pipeline()
            pipe.sadd(self._keys.jobs(), job_id)
            pipe.hsetnx(self._k(job_id), "state", JobState.RUNNING.value)
            pipe.hset(self._k(job_id), mapping={"output": output_uri, "registered": time.time()})
            pipe.execute()

    def job_info(self, job_id: str) -> dict[str, str]:
        with redis_errors("reading the job registry"):
            raw = cast(Mapping[bytes, bytes], self._r.hgetall(self._k(job_id)))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def jobs(self) -> list[str]:
        with redis_errors("listing jobs"):
            return sorted(m.decode() for m in cast(Iterable[bytes], self._r.smembers(self._keys.jobs())))

    def job_state(self, job_id: str) -> tuple[JobState, str]:
        """(state, pause reason): RUNNING, PREFLIGHT or PAUSED."""
        with redis_errors("reading the job state"):
            state, reason = cast(
                list[bytes | None], self._r.hmget(self._k(job_id), ["state", "pause_reason"])
            )
        return JobState.parse((state or b"").decode()), (reason or b"").decode()

    def pause_job(self, job_id: str, reason: str) -> bool:
        """Pause the job (workers stop taking its chunks); True if it was running."""
        with redis_errors("pausing the job"):
            pipe = self._r.pipeline()
            pipe.hget(self._k(job_id), "state")
            pipe.hset(
                self._k(job_id),
                mapping={"state": JobState.PAUSED.value, "pause_reason": reason, "paused_at": time.time()},
            )
            previous, _ = pipe.execute()
        return bool(previous != JobState.PAUSED.value.encode())

    def set_preflight(self, job_id: str, active: bool) -> None:
        """Mark the job as running its preflight: only the sample is queued, nobody re-plans it."""
        with redis_errors("setting the job state"):
            self._r.hset(self._k(job_id), "state", (JobState.PREFLIGHT if active else JobState.RUNNING).value)

    def resume_job(self, job_id: str) -> None:
        with redis_errors("resuming the job"):
            self._r.hset(self._k(job_id), mapping={"state": JobState.RUNNING.value, "pause_reason": ""})
            self._r.delete(self._k(job_id, "recent"), self._k(job_id, "parked"), self._k(job_id, "failures"))

    def push_recent(self, job_id: str, entry: Mapping[str, Any], keep: int) -> list[dict[str, Any]]:
        """Add a chunk's quality summary; returns the newest ``keep`` summaries."""
        key = self._k(job_id, "recent")
        with redis_errors("recording chunk quality"):
            pipe = self._r.pipeline()
            pipe.lpush(key, json.dumps(entry))
            pipe.ltrim(key, 0, keep - 1)
            pipe.lrange(key, 0, keep - 1)
            rows = pipe.execute()[-1]
        return [json.loads(row) for row in rows]

    def count_chunk_failure(self, job_id: str, chunk: int) -> int:
        """Count one more failed run of ``chunk``; returns its failures so far."""
        with redis_errors("counting a chunk failure"):
            return int(self._r.hincrby(self._k(job_id, "failures"), str(chunk), 1))

    def park_chunk(self, job_id: str, chunk: int, reason: str) -> None:
        """Stop re-queuing a chunk that keeps failing; ``resume`` un-parks it."""
        with redis_errors("parking a chunk"):
            self._r.hset(self._k(job_id, "parked"), str(chunk), reason[:500])

    def parked(self, job_id: str) -> dict[int, str]:
        """Parked chunks and why."""
        with redis_errors("reading parked chunks"):
            raw = cast(Mapping[bytes, bytes], self._r.hgetall(self._k(job_id, "parked")))
        return {int(k): v.decode() for k, v in raw.items()}

    def unpark_all(self, job_id: str) -> None:
        with redis_errors("un-parking chunks"):
            self._r.delete(self._k(job_id, "parked"), self._k(job_id, "failures"))

    def finish_job(self, job_id: str) -> None:
        """Forget a finished job's registry entry (the store keeps everything)."""
        with redis_errors("unregistering the job"):
            self._r.srem(self._keys.jobs(), job_id)

    # -- leases -----------------------------------------------------------------------------------
    def acquire(self, job_id: str, chunk: int, owner: str, lease_seconds: float) -> bool:
        """Lease ``chunk`` for ``owner``; False when another owner holds a live lease."""
        now = time.time()
        with redis_errors("taking a chunk lease"):
            got = self._acquire(
                keys=[self._k(job_id, "leases"), self._k(job_id, "owners")],
                args=[chunk, owner, now, now + lease_seconds],
            )
        return bool(got)

    def renew(self, leases: Iterable[tuple[str, int, str]], lease_seconds: float) -> None:
        """Extend the given (job, chunk, owner) leases; re-creates them if Redis lost them."""
        keys: list[str] = []
        args: list[Any] = []
        for job_id, chunk, owner in leases:
            keys += [self._k(job_id, "leases"), self._k(job_id, "owners")]
            args += [chunk, owner]
        if not keys:
            return
        with redis_errors("renewing chunk leases"):
            self._renew(keys=keys, args=[*args, time.time() + lease_seconds])

    def release(self, job_id: str, chunk: int, owner: str) -> None:
        with redis_errors("releasing a chunk lease"):
            self._release(keys=[self._k(job_id, "leases"), self._k(job_id, "owners")], args=[chunk, owner])

    def complete(self, job_id: str, chunk: int, counters: Mapping[str, float]) -> bool:
        """Record ``chunk`` as done and add ``counters`` (once per chunk). True on the first completion."""
        args: list[Any] = [chunk]
        for name, value in counters.items():
            args += [name, value]
        keys = [self._k(job_id, w) for w in ("leases", "owners", "done", "stats")]
        with redis_errors("recording a finished chunk"):
            return bool(self._complete(keys=keys, args=args))

    def complete_repair(self, job_id: str, chunk: int, round_: int, counters: Mapping[str, float]) -> bool:
        """Record repair round ``round_`` of ``chunk`` as stored, release the chunk's lease, and add
        ``counters`` (once per chunk and round). True on the first completion."""
        args: list[Any] = [chunk, f"{chunk}:{round_}"]
        for name, value in counters.items():
            args += [name, value]
        keys = [self._k(job_id, w) for w in ("leases", "owners", "repairs", "stats")]
        with redis_errors("recording a repair round"):
            return bool(self._complete_repair(keys=keys, args=args))

    def live_leases(self, job_id: str, now: float | None = None) -> dict[int, float]:
        """Running chunks: chunk -> lease expiry, for leases not yet expired."""
        with redis_errors("reading leases"):
            rows = self._r.zrangebyscore(
                self._k(job_id, "leases"), time.time() if now is None else now, "+inf", withscores=True
            )
        return {int(m): float(s) for m, s in cast(list[tuple[bytes, float]], rows)}

    def expired_leases(self, job_id: str, now: float | None = None) -> list[int]:
        with redis_errors("reading leases"):
            rows = self._r.zrangebyscore(
                self._k(job_id, "leases"), "-inf", time.time() if now is None else now
            )
        return [int(m) for m in cast(list[bytes], rows)]

    def claim_expired(self, job_id: str, chunk: int) -> bool:
        """Remove an expired lease; True for exactly one of several concurrent reconcilers."""
        with redis_errors("claiming an expired lease"):
            removed = self._claim(
                keys=[self._k(job_id, "leases"), self._k(job_id, "owners")], args=[chunk, time.time()]
            )
        return bool(removed)

    def unacked_deliveries(self) -> list[UnackedDelivery]:
        """Every chunk message delivered to a worker and not yet acknowledged (kombu's own keys)."""
        return unacked_deliveries(self._r)

    def owners(self, job_id: str) -> dict[int, str]:
        with redis_errors("reading lease owners"):
            raw = cast(Mapping[bytes, bytes], self._r.hgetall(self._k(job_id, "owners")))
        return {int(k): v.decode() for k, v in raw.items()}

    # -- done markers and counters ------------------------------------------------------------------
    def mark_done(self, job_id: str, chunks: Iterable[int]) -> None:
        """Seed the done set from the store (after a restart or a Redis loss)."""
        batch = [str(c) for c in chunks]
        with redis_errors("seeding done chunks"):
            for i in range(0, len(batch), 10_000):
                self._r.sadd(self._k(job_id, "done"), *batch[i : i + 10_000])

    def unmark_done(self, job_id: str, chunks: Iterable[int]) -> None:
        """Forget chunks whose outputs were deleted (a failed preflight), so they count again."""
        batch = [str(c) for c in chunks]
        if batch:
            with redis_errors("forgetting done chunks"):
                self._r.srem(self._k(job_id, "done"), *batch)

    def done_count(self, job_id: str) -> int:
        with redis_errors("counting done chunks"):
            return int(self._r.scard(self._k(job_id, "done")))

    def stats(self, job_id: str) -> dict[str, float]:
        with redis_errors("reading job counters"):
            raw = cast(Mapping[bytes, bytes], self._r.hgetall(self._k(job_id, "stats")))
        return {k.decode(): float(v) for k, v in raw.items()}

    def rate_buckets(self, job_id: str, window: tuple[int, int]) -> dict[int, dict[str, float]]:
        """The job's 5-second rate buckets starting in ``[start, end)`` (bucket start -> counts)."""
        start, end = window
        starts = list(range(start, end, BUCKET_SECONDS))
        with redis_errors("reading the job's rates"):
            pipe = self._r.pipeline(transaction=False)
            for b in starts:
                pipe.hgetall(self._keys.bucket(job_id, b))
            rows = cast(list[Mapping[bytes, bytes]], pipe.execute())
        return {
            b: {k.decode(): float(v) for k, v in row.items()}
            for b, row in zip(starts, rows, strict=True)
            if row
        }

    # -- workers ------------------------------------------------------------------------------
    def heartbeats(self) -> dict[str, dict[str, str]]:
        """Every registered worker's last heartbeat (name -> fields); forgets expired workers."""
        with redis_errors("reading the worker heartbeats"):
            return read_heartbeats(self._r, self._keys)

    def try_lock(self, name: str, owner: str, seconds: float) -> bool:
        """A short best-effort lock (e.g. one reconciler at a time)."""
        with redis_errors("taking a lock"):
            return bool(self._r.set(self._keys.lock(name), owner, nx=True, px=int(seconds * 1000)))


def read_heartbeats(client: redis.Redis | redis.client.Pipeline, keys: Keys) -> dict[str, dict[str, str]]:
    """The heartbeats of the workers in ``P:workers``; drops the names whose heartbeat expired.

    Raises redis-py errors: callers translate them (:class:`~dflash_tasks.coord.connection.redis_errors`).
    """
    names = sorted(m.decode() for m in cast(Iterable[bytes], client.smembers(keys.workers())))
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.worker(name))
    rows = cast(list[Mapping[bytes, bytes]], pipe.execute())
    gone = [name for name, row in zip(names, rows, strict=True) if not row]
    if gone:
        client.srem(keys.workers(), *gone)
    return {
        name: {k.decode(): v.decode() for k, v in row.items()}
        for name, row in zip(names, rows, strict=True)
        if row
    }
