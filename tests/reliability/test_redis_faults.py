"""Redis going away: a restart with AOF on (nothing to do), and data loss (re-run enqueue).

With AOF (``appendfsync always`` here, ``everysec`` in production) a restarted Redis comes back
with its queue, unacked deliveries, leases and job registry: workers reconnect and the job
finishes on its own. Without it (or after ``FLUSHALL``) Redis comes back empty: re-running the
same ``enqueue`` command re-plans from the store and queues exactly what is missing. A re-run
that comes before the workers' heartbeats have re-created their leases also queues the chunks
they are running, and another worker may then generate such a chunk a second time: the waste is
bounded by the chunks running at the loss (their records are still stored once).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import Processes, RedisServer, processes, wait_until
from tests.reliability.support import (
    Collector,
    enqueue,
    enqueue_ok,
    fault,
    last_json,
    outputs,
    owners,
    redis_client,
    settle,
    start_worker,
    verify_json,
    wait_done,
    write_questions,
)

pytestmark = pytest.mark.reliability

SIM = ("--time-scale", "0.02", "--mean-output-tokens", "800")  # ~0.4 s per request
WORKER = ("--max-inflight", "8", "--max-chunks", "2")


def _start(procs: Processes) -> str:
    sim = procs.simulator(*SIM)
    for name in ("gpu0", "gpu1"):
        start_worker(procs, sim, name, *WORKER)
    return sim


def test_redis_restart_with_aof_mid_run_needs_no_reenqueue(
    procs: Processes, tmp_path: Path, redis_server: RedisServer, reliability: Collector
) -> None:
    inp, out = write_questions(tmp_path / "prompts.jsonl", 160, "aof"), tmp_path / "out"
    sim = _start(procs)
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")  # no --wait: nothing re-plans
    job_id, chunks = str(summary["job_id"]), int(summary["chunks"])
    wait_until(lambda: len(outputs(out)) >= 4, 60, "the first chunks")
    redis_server.stop(signal.SIGKILL)
    time.sleep(1.0)
    redis_server.start()
    restarted = time.monotonic()
    before = set(owners(procs, job_id).values())  # leases restored from the AOF
    assert redis_client(procs).llen(procs.model_queue()) > 0, "the queue did not survive the restart"
    wait_until(lambda: set(owners(procs, job_id).values()) - before, 60, "a chunk leased after the restart")
    back = time.monotonic() - restarted
    wait_done(out, chunks, 120)
    settle(
        reliability,
        procs,
        family="4",
        fault="Redis SIGKILL + restart mid-run, AOF on (appendfsync always), down 1 s",
        inp=inp,
        out=out,
        runs=1,
        recover_s=back,
        measured="Redis back → workers lease new chunks",
        notes="enqueue not re-run (no --wait): the job finished on its own; redelivered chunks "
        "skipped as done or running, none generated twice",
        sims=[sim],
    )


def test_redis_flushall_mid_run_then_rerun_enqueue(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    inp, out = write_questions(tmp_path / "prompts.jsonl", 160, "flush"), tmp_path / "out"
    sim = _start(procs)
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")
    chunks = int(summary["chunks"])
    wait_until(lambda: len(outputs(out)) >= 4, 60, "the first chunks")
    running = owners(procs, str(summary["job_id"]))
    redis_client(procs).flushall()
    lost_at = time.monotonic()
    rerun = enqueue_ok(procs, inp, out, "--chunk-size", "8")
    requeued = time.monotonic() - lost_at
    parts = ("chunks_enqueued", "chunks_done", "chunks_running", "chunks_queued_before")
    assert sum(rerun[k] for k in parts) == chunks, rerun
    wait_done(out, chunks, 120)
    settle(
        reliability,
        procs,
        family="4",
        fault="Redis FLUSHALL mid-run (queue, leases, registry gone)",
        inp=inp,
        out=out,
        runs=1,
        recover_s=requeued,
        measured="data lost → re-run enqueue has queued every missing chunk",
        notes=f"re-run: {rerun['chunks_done']} done, {rerun['chunks_running']} running, "
        f"{rerun['chunks_enqueued']} queued again; {len(running)} chunks were running at the flush",
        sims=[sim],
        allowed_waste=8 * len(running),  # re-queued before their leases were re-created
    )


def test_redis_without_aof_killed_and_restarted_then_rerun_enqueue(
    tmp_path: Path, reliability: Collector
) -> None:
    server = RedisServer(tmp_path / "redis-no-aof", appendonly=False)
    try:
        with processes(tmp_path, server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
            inp, out = write_questions(tmp_path / "prompts.jsonl", 160, "noaof"), tmp_path / "out"
            sim = _start(procs)
            summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")
            chunks = int(summary["chunks"])
            wait_until(lambda: len(outputs(out)) >= 4, 60, "the first chunks")
            running = owners(procs, str(summary["job_id"]))
            server.stop(signal.SIGKILL)
            server.start()
            lost_at = time.monotonic()
            # Workers reconnect at once and write fresh heartbeats, so check what was lost instead.
            r = redis_client(procs)
            assert r.llen(procs.model_queue()) == 0, (
                "a Redis without AOF or RDB restarts empty: the queue is gone"
            )
            assert not r.hget(f"t-{procs.queue}:job:{summary['job_id']}", "output"), (
                "the job registry is gone"
            )
            res = enqueue(procs, inp, out, "--chunk-size", "8")
            requeued = time.monotonic() - lost_at
            assert res.returncode == 0, res.stderr
            rerun = last_json(res.stdout)
            wait_done(out, chunks, 120)
            settle(
                reliability,
                procs,
                family="4",
                fault="Redis without AOF SIGKILLed and restarted empty mid-run",
                inp=inp,
                out=out,
                runs=1,
                recover_s=requeued,
                measured="Redis back → re-run enqueue has queued every missing chunk",
                notes=f"re-run: {rerun['chunks_done']} done, {rerun['chunks_running']} running, "
                f"{rerun['chunks_enqueued']} queued again; {len(running)} chunks were running at the loss",
                sims=[sim],
                allowed_waste=8 * len(running),
            )
    finally:
        server.stop(signal.SIGKILL)


def test_enqueue_wait_rides_out_a_redis_restart_in_its_repair_rounds(
    procs: Processes, tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis goes away as a repair round is about to be queued: ``enqueue --wait`` retries as its
    first pass does, queues the round once Redis is back, waits for it and exits 0."""
    samples, failed = 64, 8
    inp, out = write_questions(tmp_path / "prompts.jsonl", samples, "repair-restart"), tmp_path / "out"
    sim = procs.simulator("--time-scale", "0.001")
    start_worker(procs, sim, "gpu0", env={"DFLASH_REQUEST_ATTEMPTS": "2", "DFLASH_MAX_INFLIGHT": "1"})
    fault(sim, "http_500", count=2 * failed)  # the first 8 samples fail both attempts: transient
    procs.env["DFLASH_REPAIR_SPACING_SECONDS"] = "2"
    producer = procs.spawn(
        [
            *("-m", "dflash_tasks.producer.enqueue", "--input", str(inp), "--output", str(out)),
            *("--model", "Qwen/Qwen3-8B", "--no-preflight", "--json", "--chunk-size", "8", "--wait"),
        ],
        "enqueue.log",
    )
    log = tmp_path / "enqueue.log"
    wait_until(lambda: b"repair round 1 of" in log.read_bytes(), 120, "the first repair round")
    redis_server.stop(signal.SIGKILL)  # down through the spacing: queueing the round meets it
    time.sleep(4.0)
    redis_server.start()
    rc = producer.wait(120)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert "queueing the repair round failed (retrying every 1s): Redis error" in text
    assert "repair: 1 rounds run; none left" in text
    repair_files = sorted(p.name for p in (out / "outputs").glob("*.repair-*.jsonl"))
    assert repair_files and all(name.endswith(".repair-1.jsonl") for name in repair_files)  # queued once
    repaired = [
        json.loads(line)
        for name in repair_files
        for line in (out / "outputs" / name).read_text().splitlines()
    ]
    assert len(repaired) == failed and len({r["id"] for r in repaired}) == failed
    assert all(r["status"] == "ok" and r["repair"] == 1 for r in repaired)
    rc, result = verify_json(procs, inp, out)
    assert rc == 0 and (result["ok"], result["repaired"], result["failed"]) == (samples, failed, 0), result
