"""run_chunk directly: generate once, skip what is done or running, cancel a failed chunk's requests.

Real Redis, a real local store and the simulator over HTTP; generation is counted by the
simulator (``GET /sim/requests``), so a chunk generated twice cannot pass for one stored once.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from dflash_tasks.coord.jobs_cache import JobHandle, UnknownChunk
from dflash_tasks.core.errors import ServerUnavailable
from dflash_tasks.core.job import output_key
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.spec_stats import SampleCounts
from dflash_tasks.store import LocalStore
from tests.helpers import wait_until
from tests.workers.chunk_support import CHUNK_SIZE, Staged, stage_job
from workers.chunk_runner import run_chunk
from workers.monitor.listener import Listeners
from workers.recovery.leases import LeaseKeeper
from workers.task import task_result

OTHER = b'{"id": "written by another worker"}\n'


def test_a_chunk_is_generated_once_and_a_second_delivery_sends_nothing(staged: Staged) -> None:
    first = run_chunk(staged.ctx, staged.job_id, 0, "w@h/t1/aaaaaa")
    assert (first.status, first.samples_ok, first.samples_failed) == ("done", CHUNK_SIZE, 0)
    stored = staged.store.read(output_key(0))
    assert [json.loads(line)["id"] for line in stored.splitlines()] == ["s0", "s1", "s2", "s3"]
    log = staged.sim_log()
    assert (log["samples"], log["generated"], log["wasted"]) == (CHUNK_SIZE, CHUNK_SIZE, 0)
    assert staged.bk.done_count(staged.job_id) == 1 and staged.bk.live_leases(staged.job_id) == {}
    assert staged.ctx.leases.held() == []  # the heartbeat no longer renews it

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


def test_a_paused_jobs_chunk_is_not_run_even_when_the_pause_comes_after_the_delivery(staged: Staged) -> None:
    # The pause is read with the lease held, so a producer that saw no live lease after pausing
    # (a failed preflight deleting its outputs) knows that no chunk of the job starts later.
    staged.bk.pause_job(staged.job_id, "preflight failed: no reasoning")
    outcome = run_chunk(staged.ctx, staged.job_id, 1, "w@h/t1/aaaaaa")
    assert (outcome.status, outcome.reason) == ("paused", "preflight failed: no reasoning")
    assert staged.sim_log()["received"] == 0 and not staged.store.exists(output_key(1))
    assert staged.bk.live_leases(staged.job_id) == {} and staged.ctx.leases.held() == []


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


class _Sink:
    """Records the events the chunk runner reports to its listener (metrics, live progress)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        self.calls.append(("sample", job_id, str(counts.ok)))

    def chunk_started(self, job_id: str) -> None:
        self.calls.append(("started", job_id))

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        self.calls.append(("done", job_id))


def test_a_stored_chunk_carries_its_checks_and_counts_them_once(staged: Staged) -> None:
    """Every record is checked; the counters and the live gate's window get the chunk once."""
    strict = QualitySettings(min_completion_tokens=10**6)  # every answer is "short"
    job_id, store, _ = stage_job(staged.root.parent, staged.bk, quality=strict)
    sink = _Sink()
    ctx = dataclasses.replace(staged.ctx, listener=Listeners([sink]))  # type: ignore[list-item]
    started = time.monotonic()
    outcome = run_chunk(ctx, job_id, 1, "w@h/t1/aaaaaa")
    took = time.monotonic() - started
    raw = store.read(output_key(1))
    assert "café".encode() in raw  # stored as UTF-8 text, not \\u escapes
    records = [json.loads(line) for line in raw.splitlines()]
    assert [r["checks"] for r in records] == [["short"]] * CHUNK_SIZE
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    assert (outcome.status, outcome.reason, outcome.samples_ok, outcome.samples_failed) == ("done", "", 4, 0)
    assert outcome.completion_tokens == tokens > 0 and 0 < outcome.seconds <= took
    stats = staged.bk.stats(job_id)
    assert stats.pop("chunk_seconds") <= took
    assert (stats.pop("turns"), stats.pop("generations")) == (4.0, 4.0)  # one turn per sample here
    assert stats.pop("spec_tokens") == tokens and stats.pop("spec_verify_ct") > 0
    assert stats == {
        "samples_ok": 4.0,
        "samples_failed": 0.0,
        "completion_tokens": float(tokens),
        "prompt_tokens": float(sum(r["usage"]["prompt_tokens"] for r in records)),
        "check_short": 4.0,
    }
    recent = staged.bk.client.lrange(f"{staged.bk.prefix}:job:{job_id}:recent", 0, -1)
    assert [json.loads(r) for r in recent] == [{"n": 4, "checks": {"short": 4}}]  # the live gate's window
    assert sink.calls[0] == ("started", job_id) and sink.calls[-1] == ("done", job_id)
    assert sorted(sink.calls[1:-1]) == [("sample", job_id, "True")] * CHUNK_SIZE
    assert task_result(outcome) == {  # what the Celery task returns
        "status": "done",
        "reason": "",
        "cause": "",
        "samples_ok": 4,
        "samples_failed": 0,
        "completion_tokens": tokens,
        "seconds": round(outcome.seconds, 3),
    }


def test_each_delivery_sends_its_own_request_ids(staged: Staged) -> None:
    run_chunk(staged.ctx, staged.job_id, 0, "w@h/t1/aaaaaa")
    rids = sorted(r["rid"] for r in staged.sim_log()["recent"])
    assert all(rid.startswith(f"{staged.job_id}-0-aaaaaa-") for rid in rids), rids
    assert len(set(rids)) == CHUNK_SIZE


def test_a_running_chunks_lease_is_kept_alive_by_the_heartbeat(staged: Staged) -> None:
    """Generation outlasting the lease: the heartbeat renews it, and lets go when the chunk ends."""
    keeper = LeaseKeeper(staged.bk, lease_seconds=0.6, heartbeat_seconds=0.1)
    ctx = dataclasses.replace(staged.ctx, leases=keeper, lease_seconds=0.6)
    staged.fault("hang", count=1, hang_seconds=1.5)  # the first request takes 1.5 s
    keeper.start()
    seen: list[dict[int, float]] = []
    try:
        worker = threading.Thread(target=run_chunk, args=(ctx, staged.job_id, 0, "w@h/t1/aaaaaa"))
        worker.start()
        time.sleep(1.0)  # past the 0.6 s lease
        seen.append(staged.bk.live_leases(staged.job_id))
        assert keeper.held() == [(staged.job_id, 0, "w@h/t1/aaaaaa")]
        worker.join(60)  # generous: on a loaded machine the chunk's write can take seconds
        assert not worker.is_alive()
    finally:
        keeper.stop()
    assert list(seen[0]) == [0] and staged.bk.owners(staged.job_id) == {}
    assert keeper.held() == [] and staged.store.exists(output_key(0))
