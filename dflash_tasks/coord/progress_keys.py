"""Where a job's live progress lives: the Redis key layout and the time buckets of its rates.

Workers write these keys (:mod:`workers.stats`); :mod:`dflash_tasks.monitoring.snapshot`
reads them and :mod:`dflash_tasks.monitoring.progress_writer` bills GPU time into them.

Keys (``P`` the prefix, ``J`` a job id, ``W`` a worker's hostname, ``T`` a unix time)::

    P:job:J                 hash (the bookkeeping job hash) + started_at, finished_at,
                            gpu_seconds, gpu_tick, gpu_hour_usd, progress_final
    P:job:J:workers         hash "W|samples", "W|failed", "W|tokens", "W|chunks", "W|first"
    P:job:J:rate:T          hash per 5-second bucket starting at T: samples, failed, tokens,
                            "W|samples", "W|tokens"; expires after 15 minutes
    P:worker:W              hash: endpoint, last_seen, beat_s, inflight, waiting, max_inflight,
                            held_chunks, healthy, spec_accept_length, model (served model
                            name), model_path, sglang_version, queues (comma-separated)
    P:workers               set of worker hostnames that sent a heartbeat (expired ones are
                            dropped by readers)
    P:lock:progress:J       the writer lock (one writer per period)

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
#: Rate buckets expire after this long (s).
BUCKET_TTL = 15 * 60
#: Workers push their counts at least this often (s); the window ends this long before now.
FLUSH_LAG = 2.5
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

    def workers(self) -> str:
        return f"{self.prefix}:workers"


def bucket_start(t: float) -> int:
    return int(t // BUCKET_SECONDS) * BUCKET_SECONDS


def window_bounds(now: float) -> tuple[int, int]:
    """[start, end) of the rate window: the last full minute of buckets that every worker flushed."""
    end = bucket_start(now - FLUSH_LAG)
    return end - WINDOW_SECONDS, end


def queue_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue`` (one per priority step; unprioritised = the name)."""
    return [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
