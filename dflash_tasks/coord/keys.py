"""Every Redis key we read or write, in one place: ours under a prefix, and kombu's own.

Ours (``P`` the prefix, ``J`` a job id, ``W`` a worker's hostname, ``N`` a chunk, ``T`` a unix time)::

    P:jobs                  set of registered job ids
    P:job:J                 hash: output, state, reason, registered, started_at, finished_at,
                            gpu_seconds, gpu_tick, gpu_hour_usd, progress_final
    P:job:J:leases          zset chunk -> lease expiry
    P:job:J:owners          hash chunk -> worker holding its lease
    P:job:J:done            set of chunks seen stored (a cache of the store)
    P:job:J:repairs         set of "N:R": repair round R of chunk N stored (its counters moved)
    P:job:J:stats           hash of counters, moved once per chunk
    P:job:J:failures        hash chunk -> failures in a row
    P:job:J:parked          hash chunk -> why it was parked
    P:job:J:recent          list of recent chunks' quality counts (the live gate)
    P:job:J:workers         hash "W|samples", "W|failed", "W|tokens", "W|chunks", "W|first",
                            "W|spec_tokens", "W|verify"
    P:job:J:rate:T          hash per 5-second bucket: samples, failed, tokens, spec_tokens, verify,
                            "W|samples", "W|tokens", "W|spec_tokens", "W|verify"
    P:worker:W              hash: the worker's heartbeat (endpoint, last_seen, beat_s, inflight,
                            waiting, max_inflight, held_chunks, healthy, server_accept_length,
                            model, model_path, sglang_version, queues)
    P:workers               set of worker hostnames that sent a heartbeat (readers drop stale ones)
    P:lock:NAME             a short lock (e.g. ``progress:J``: one progress.json writer per period)

kombu's (Celery's Redis transport; read, never written, by the planner and the rescue of
deliveries to dead workers): the queue lists (:func:`queue_keys`), ``unacked`` (hash delivery tag
-> message) and ``unacked_index`` (zset delivery tag -> time delivered).
"""

from __future__ import annotations

#: kombu: every delivered, not yet acknowledged message, by delivery tag.
UNACKED = "unacked"
#: kombu: when each unacknowledged message was delivered.
UNACKED_INDEX = "unacked_index"


class Keys:
    """Our key names under one prefix (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def job(self, job_id: str, what: str = "") -> str:
        """The job's hash, or its ``what`` key (``leases``, ``owners``, ``done``, ...)."""
        return f"{self.prefix}:job:{job_id}" + (f":{what}" if what else "")

    def stats(self, job_id: str) -> str:
        return self.job(job_id, "stats")

    def leases(self, job_id: str) -> str:
        return self.job(job_id, "leases")

    def job_workers(self, job_id: str) -> str:
        return self.job(job_id, "workers")

    def bucket(self, job_id: str, start: int) -> str:
        return self.job(job_id, f"rate:{start}")

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"


def queue_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue`` (one per priority step; unprioritised = the name)."""
    return [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
