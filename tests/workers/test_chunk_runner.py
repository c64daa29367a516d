"""run_chunk directly: generate once, skip what is done or running, cancel a failed chunk's requests.

Real Redis, a real local store and the simulator over HTTP; generation is counted by the
simulator (``GET /sim/requests``), so a chunk generated twice cannot pass for one stored once.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dflash_tasks.coord.jobs_cache import JobHandle, UnknownChunk
from dflash_tasks.core.errors import ServerUnavailable
from dflash_tasks.core.job import output_key
from dflash_tasks.store import LocalStore
from tests.helpers import wait_until
from tests.workers.chunk_support import CHUNK_SIZE, Staged
from workers.chunk_runner import run_chunk

OTHER = b'{"id": "written by another worker"}\n'


def test_a_chunk_is_generated_once_and_a_second_delivery_sends_nothing(staged: Staged) -> None:
    first = run_chunk(staged.ctx, staged.job_id, 0, "w@h/t1/aaaaaa")
    assert (first.status, first.samples_ok, first.samples_failed) == ("done", CHUNK_SIZE, 0)
    stored = staged.store.read(output_key(0))
    assert [json.loads(line)["id"] for line in stored.splitlines()] == ["s0", "s1", "s2", "s3"]
    log = staged.sim_log()
    assert (log["samples"], log["generated"], log["wasted"]) == (CHUNK_SIZE, CHUNK_SIZE, 0)
    assert staged.bk.done_count(staged.job_id) == 1 and staged.bk.live_leases(staged.job_id) == {}

    again = run_chunk(staged.ctx, staged.job_id, 0, "w@h/t2/bbbbbb")  # a redelivery of a done chunk
    assert (again.status, again.reason) == ("skipped", "already done")
    assert staged.sim_log()["received"] == CHUNK_SIZE  # not one more request
    assert staged.store.read(output_key(0)) == stored  # the first write stands


def test_a_done_chunk_is_skipped_before_its_lease_is_even_asked_for(staged: Staged) -> None:
    staged.store.write(output_key(1), OTHER)
    staged.bk.acquire(staged.job_id, 1, "late-duplicate", 60)  # a stray lease on a done chunk
    outcome = run_chunk(staged.ctx, staged.job_id, 1, "w@h/t1/aaaaaa")
    assert (outcome.status, outcome.reason) == ("skipped", "already done")
    assert staged.bk.owners(staged.job_id) == {1: "late-duplicate"}  # the lease was not touched
    assert staged.sim_log()["received"] == 0


class _FinishedMeanwhile:
    """The job's real store, where another worker stores the chunk right after the first check."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner
        self.raced = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def exists(self, key: str) -> bool:
        found = self.inner.exists(key)
        if key.startswith("outputs/") and not self.raced:
            self.raced = True
            self.inner.write(key, OTHER)
        return found


class _Jobs:
    def __init__(self, staged: Staged, store: _FinishedMeanwhile) -> None:
        self.staged, self.store = staged, store

    def get(self, job_id: str) -> JobHandle:
        handle = self.staged.ctx.jobs.get(job_id)
        return JobHandle(handle.definition, handle.manifest, self.store, handle.output)  # type: ignore[arg-type]


def test_a_chunk_stored_elsewhere_while_its_lease_was_taken_is_not_generated(staged: Staged) -> None:
    racing = _FinishedMeanwhile(staged.store)
    ctx = dataclasses.replace(staged.ctx, jobs=_Jobs(staged, racing))  # type: ignore[arg-type]
    outcome = run_chunk(ctx, staged.job_id, 2, "w@h/t1/aaaaaa")
    assert racing.raced and (outcome.status, outcome.reason) == ("skipped", "already done")
    assert staged.sim_log()["received"] == 0
    assert staged.store.read(output_key(2)) == OTHER
    assert staged.bk.live_leases(staged.job_id) == {}  # our lease was given back


def test_a_chunk_leased_by_a_live_worker_is_not_run(staged: Staged) -> None:
    staged.bk.acquire(staged.job_id, 0, "alive@h/t0/cccccc", 60)
    outcome = run_chunk(staged.ctx, staged.job_id, 0, "w@h/t1/aaaaaa")
    assert (outcome.status, outcome.reason) == ("skipped", "running elsewhere (live lease)")
    assert staged.bk.owners(staged.job_id) == {0: "alive@h/t0/cccccc"}
    assert staged.sim_log()["received"] == 0 and not staged.store.exists(output_key(0))


def test_a_failed_chunk_cancels_its_pending_requests(staged: Staged) -> None:
    """The server dies under the first request: the chunk's other samples are never sent."""
    staged.fault("reset")  # every request: connection reset
    staged.fault("unhealthy")  # and /health_generate says so once retries run out
    pool = staged.ctx.pool  # one request at a time: three samples wait behind the first
    with pytest.raises(ServerUnavailable):
        run_chunk(staged.ctx, staged.job_id, 0, "w@h/t1/aaaaaa")
    wait_until(lambda: pool.running == 0 and pool.waiting == 0, 10, "the request pool to drain")
    sent = staged.sim_stats()["requests_total"]
    attempts = staged.ctx.policy.attempts
    # The first sample's attempts, and at most those of the one that took its slot meanwhile;
    # without cancelling, all four samples would be tried (4 x 2 requests).
    assert attempts <= sent <= 2 * attempts < CHUNK_SIZE * attempts
    assert staged.bk.live_leases(staged.job_id) == {} and not staged.store.exists(output_key(0))


def test_a_chunk_outside_the_job_is_refused(staged: Staged) -> None:
    with pytest.raises(UnknownChunk, match="has no chunk 3 \\(it has 3\\)"):
        run_chunk(staged.ctx, staged.job_id, 3, "w@h/t1/aaaaaa")
