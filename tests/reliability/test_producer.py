"""The producer killed: while staging the input, then (re-run) while queuing chunks.

Staging is deterministic and ``manifest.json`` is written last, so a re-run stages again; the
plan reads the queue, so a re-run after a kill mid-publish queues exactly the chunks not yet
queued. (Moved here from tests/test_enqueue_e2e.py, and extended with the kill mid-publish.)
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import cast

import pytest

from dflash_tasks.coord.publish import parse_task_id
from tests.helpers import REPO, Processes, wait_until, write_prompts
from tests.reliability.support import (
    MODEL,
    Collector,
    enqueue_ok,
    outputs,
    redis_client,
    reset_sim_stats,
    settle,
    start_worker,
    write_questions,
)

pytestmark = pytest.mark.reliability


def _enqueue_process(procs: Processes, inp: Path, out: Path) -> subprocess.Popen[bytes]:
    args = [
        "--input",
        str(inp),
        "--output",
        str(out),
        "--model",
        MODEL,
        "--chunk-size",
        "20",
        "--no-preflight",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_tasks.enqueue", *args],
        cwd=REPO,
        env=procs.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_enqueue_killed_while_staging_then_while_queuing_converges(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 4_000)
    chunks = 200
    r = redis_client(procs)

    for _ in range(5):  # kill while staging; on a fast run staging may finish first: start over
        staging = _enqueue_process(procs, inp, out)
        wait_until(
            lambda: (out / "inputs").exists() and len(list((out / "inputs").iterdir())) > 20,
            30,
            "staging",
            interval=0.005,
        )
        staging.send_signal(signal.SIGKILL)
        staging.wait(10)
        if not (out / "manifest.json").exists():
            break
        shutil.rmtree(out)
        r.delete(procs.model_queue())
    assert not (out / "manifest.json").exists(), "staging always finished before the kill"
    assert r.llen(procs.model_queue()) == 0

    for _ in range(5):  # kill while publishing (one pipelined batch): retry until it lands mid-way
        queuing = _enqueue_process(procs, inp, out)
        deadline = time.monotonic() + 60
        while r.llen(procs.model_queue()) == 0 and queuing.poll() is None and time.monotonic() < deadline:
            pass  # a tight loop: the batch takes milliseconds
        queuing.send_signal(signal.SIGKILL)
        queuing.wait(10)
        queued_at_kill = int(r.llen(procs.model_queue()))
        if 0 < queued_at_kill < chunks:
            break
        r.delete(procs.model_queue())
    assert (out / "manifest.json").exists()
    assert 0 < queued_at_kill < chunks, f"{queued_at_kill} of {chunks} queued: not killed mid-publish"

    started = time.monotonic()
    rerun = enqueue_ok(procs, inp, out, "--chunk-size", "20")
    converged = time.monotonic() - started
    assert rerun["chunks_queued_before"] == queued_at_kill
    assert rerun["chunks_enqueued"] == chunks - queued_at_kill
    raw = cast(list[bytes], r.lrange(procs.model_queue(), 0, -1))
    parsed = [parse_task_id(json.loads(m)["headers"]["id"]) for m in raw]
    per_chunk = Counter(p[1] for p in parsed if p is not None and p[0] == rerun["job_id"])
    assert len(raw) == chunks and set(per_chunk.values()) == {1}, "a chunk is queued twice"
    assert set(per_chunk) == set(range(chunks))

    sim = procs.simulator("--time-scale", "0")
    start_worker(procs, sim, "producer-gpu0", "--max-inflight", "64")
    wait_until(lambda: len(outputs(out)) == chunks, 180, "the job to complete", interval=0.2)
    settle(
        reliability,
        procs,
        family="8",
        fault="enqueue SIGKILLed while staging, then (re-run) while queuing",
        inp=inp,
        out=out,
        runs=2,
        recover_s=converged,
        measured="re-run → every chunk queued exactly once",
        notes=f"killed after >20 of {chunks} staged chunks, then after {queued_at_kill} of {chunks} "
        f"queued; the re-run queued the other {chunks - queued_at_kill}",
        sims=[sim],
    )


def test_same_job_enqueued_again_into_a_second_output_completes(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    """Same input and settings make the same job id; a second output must get its own chunks.

    Regression: workers cached the first output's location for the job id, so every delivery of
    the second run was skipped as "already done" there and the second run never finished.
    """
    inp = write_questions(tmp_path / "prompts.jsonl", 64, "again")
    first, second = tmp_path / "first", tmp_path / "second"
    sim = procs.simulator("--time-scale", "0.001")
    start_worker(procs, sim, "again-gpu0")
    one = enqueue_ok(procs, inp, first, "--chunk-size", "16", "--wait")
    reset_sim_stats(sim)  # the second output is generated anew, on purpose: count it alone
    started = time.monotonic()
    two = enqueue_ok(procs, inp, second, "--chunk-size", "16", "--wait")
    assert one["job_id"] == two["job_id"] and two["chunks_done"] == two["chunks"] == 4
    assert len(outputs(second)) == 4
    settle(
        reliability,
        procs,
        family="8",
        fault="same input and settings enqueued again into a second output (same job id)",
        inp=inp,
        out=second,
        runs=1,
        recover_s=time.monotonic() - started,
        measured="second enqueue --wait → done",
        notes="workers follow the job's newly registered output (was: hung, chunks skipped as done "
        "in the first output)",
        sims=[sim],
    )
