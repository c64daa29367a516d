"""A generated chunk survives store and Redis trouble at store time: retried in place, not re-generated.

Real Redis (stopped and restarted for real), a real local store whose fsync fails with ENOSPC, and
the simulator over HTTP, which counts the generations: a chunk generated twice cannot pass here.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import threading
from collections.abc import Callable

import pytest

from dflash_tasks.coord.jobs_cache import JobHandle
from dflash_tasks.core.errors import RetryableError, StoreError
from dflash_tasks.core.job import output_key
from dflash_tasks.store import LocalStore
from tests.helpers import RedisServer
from tests.workers.chunk_support import CHUNK_SIZE, Staged
from workers.chunk_runner import run_chunk
from workers.generation import RetryPolicy
from workers.leased_work import ChunkContext
from workers.recovery.retrying import retry_transient

OWNER = "w@h/t1/aaaaaa"
RETRIED = "retrying in"  # the retry helper's WARNING line


def _fsync_failing(monkeypatch: pytest.MonkeyPatch, times: int | None) -> list[int]:
    """os.fsync raises ENOSPC ``times`` times (None: always), as a disk filling up mid-write does."""
    real, calls = os.fsync, [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if times is None or calls[0] <= times:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


class _Store:
    """The job's real store; ``after`` runs right after its first chunk write (and may raise)."""

    def __init__(self, inner: LocalStore, after: Callable[[], None]) -> None:
        self.inner, self.after, self.writes = inner, after, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def write_new(self, key: str, data: bytes) -> bool:
        self.writes += 1
        written = self.inner.write_new(key, data)
        if self.writes == 1:
            self.after()
        return written


def _with_store(staged: Staged, store: _Store, **changes: object) -> ChunkContext:
    class Jobs:
        def get(self, job_id: str) -> JobHandle:
            handle = staged.ctx.jobs.get(job_id)
            return JobHandle(handle.definition, handle.manifest, store, handle.output)  # type: ignore[arg-type]

    return dataclasses.replace(staged.ctx, jobs=Jobs(), **changes)  # type: ignore[arg-type]


def _retries(caplog: pytest.LogCaptureFixture, doing: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if doing in r.getMessage() and RETRIED in r.getMessage()]


def _generated_once(staged: Staged) -> None:
    log = staged.sim_log()
    assert (log["samples"], log["generated"], log["wasted"]) == (CHUNK_SIZE, CHUNK_SIZE, 0), log


def _counted_once(staged: Staged) -> None:
    assert staged.bk.done_count(staged.job_id) == 1
    stats = staged.bk.stats(staged.job_id)
    assert (stats["samples_ok"], stats["turns"]) == (CHUNK_SIZE, CHUNK_SIZE)
    recent = staged.bk.client.lrange(f"{staged.bk.prefix}:job:{staged.job_id}:recent", 0, -1)
    assert [json.loads(r)["n"] for r in recent] == [CHUNK_SIZE]  # the live gate saw it once


def _outputs(staged: Staged) -> list[str]:
    return sorted(p.name for p in (staged.root / "outputs").iterdir())


def test_a_write_failing_twice_on_a_full_disk_is_retried_and_the_chunk_generated_once(
    staged: Staged, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    _fsync_failing(monkeypatch, times=2)
    outcome = run_chunk(staged.ctx, staged.job_id, 0, OWNER)
    assert (outcome.status, outcome.samples_ok) == ("done", CHUNK_SIZE)
    _generated_once(staged)
    _counted_once(staged)
    assert _outputs(staged) == [output_key(0).split("/")[1]]  # the chunk, and no temp file
    assert len(staged.store.read(output_key(0)).splitlines()) == CHUNK_SIZE
    warned = _retries(caplog, f"storing chunk 0 of job {staged.job_id}")
    assert len(warned) == 2 and all("No space left on device" in w for w in warned), warned
    assert staged.bk.live_leases(staged.job_id) == {} and staged.ctx.leases.held() == []


def test_a_completion_while_redis_restarts_is_retried_and_counted_once(
    staged: Staged, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    restarted = threading.Timer(0.5, redis_server.start)

    def redis_goes_away() -> None:  # right after the chunk is stored, before it is recorded as done
        redis_server.stop()
        restarted.start()

    store = _Store(staged.store, after=redis_goes_away)
    ctx = _with_store(staged, store, policy=RetryPolicy(backoff=0.05, backoff_max=0.2))
    try:
        outcome = run_chunk(ctx, staged.job_id, 1, OWNER)
    finally:
        restarted.join(15)
    assert (outcome.status, outcome.samples_ok) == ("done", CHUNK_SIZE) and store.writes == 1
    _generated_once(staged)
    _counted_once(staged)
    assert _retries(caplog, f"recording as done chunk 1 of job {staged.job_id}")
    assert staged.bk.live_leases(staged.job_id) == {} and staged.ctx.leases.held() == []


def test_a_store_failing_past_the_retry_time_raises_and_leaves_nothing(
    staged: Staged, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    calls = _fsync_failing(monkeypatch, times=None)
    policy = RetryPolicy(backoff=0.02, backoff_max=0.05)
    ctx = dataclasses.replace(staged.ctx, store_retry_seconds=0.5, policy=policy)
    with pytest.raises(RetryableError, match="No space left on device"):  # re-queued by the runtime
        run_chunk(ctx, staged.job_id, 2, OWNER)
    assert calls[0] >= 2 and _retries(caplog, f"storing chunk 2 of job {staged.job_id}")
    assert not (staged.root / "outputs").exists() or _outputs(staged) == []  # no chunk, no temp file
    assert staged.bk.done_count(staged.job_id) == 0 and staged.bk.stats(staged.job_id) == {}
    assert staged.bk.live_leases(staged.job_id) == {} and staged.ctx.leases.held() == []


def test_a_write_whose_answer_was_lost_counts_as_stored(
    staged: Staged, caplog: pytest.LogCaptureFixture
) -> None:
    """The bytes landed but the call failed (an S3 response lost on the way): the retry finds them."""
    caplog.set_level(logging.WARNING)

    def lost_answer() -> None:
        raise RetryableError("writing outputs/chunk: connection reset")

    store = _Store(staged.store, after=lost_answer)
    outcome = run_chunk(_with_store(staged, store), staged.job_id, 0, OWNER)
    assert (outcome.status, outcome.reason, outcome.samples_ok) == ("done", "", CHUNK_SIZE)
    assert store.writes == 2  # the second write found our bytes there: True, not "someone else's"
    _generated_once(staged)
    _counted_once(staged)
    assert len(_retries(caplog, f"storing chunk 0 of job {staged.job_id}")) == 1


def test_a_chunk_stored_by_another_worker_during_the_retries_is_kept(staged: Staged) -> None:
    theirs = b'{"id": "written by the worker that took the chunk over"}\n'

    def taken_over() -> None:  # our write did not land; theirs did meanwhile
        staged.store.delete(output_key(0))
        staged.store.write(output_key(0), theirs)
        raise RetryableError("writing outputs/chunk: S3 answered 503")

    outcome = run_chunk(_with_store(staged, _Store(staged.store, after=taken_over)), staged.job_id, 0, OWNER)
    assert (outcome.status, outcome.reason) == ("skipped", "stored meanwhile by another worker")
    assert staged.store.read(output_key(0)) == theirs and staged.bk.done_count(staged.job_id) == 0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_retry_transient_gives_up_at_the_deadline_and_never_retries_a_permanent_error() -> None:
    clock, calls = _Clock(), [0]

    def down() -> bool:
        calls[0] += 1
        clock.now += 0.5  # each attempt takes a while too
        raise RetryableError("Redis error while recording a finished chunk: connection refused")

    policy = RetryPolicy(backoff=1.0, backoff_max=4.0)
    with pytest.raises(RetryableError):
        retry_transient(down, "recording", 30.0, policy, sleep=clock.sleep, clock=lambda: clock.now)
    assert clock.now <= 30.0 + 0.5 and calls[0] == len(clock.slept) + 1 >= 5
    assert all(0 <= s <= 4.0 for s in clock.slept)

    def denied() -> bool:
        calls[0] += 1
        raise StoreError("writing s3://b/p/outputs/x: access to S3 bucket 'b' denied (HTTP 403)")

    calls[0] = 0
    with pytest.raises(StoreError):
        retry_transient(denied, "storing", 30.0, policy, sleep=clock.sleep, clock=lambda: clock.now)
    assert calls[0] == 1
    assert retry_transient(lambda: 7, "x", 0.0, policy) == 7  # no time to retry: one attempt
