"""A worker frozen mid-chunk (SIGSTOP) wakes up (SIGCONT) after its chunk was taken over and stored.

Found by the chaos run (tests/chaos): the woken worker finished the generation it had in flight
and wrote the chunk again, replacing the stored file with other bytes (its own records) after
``verify`` had counted it. Nothing was lost or doubled, but a stored chunk must never change.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import Processes, wait_until
from tests.reliability.support import (
    Collector,
    enqueue_ok,
    held_by,
    logs,
    outputs,
    settle,
    start_worker,
    write_questions,
)

pytestmark = pytest.mark.reliability


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_worker_woken_after_its_chunk_was_stored_elsewhere_does_not_rewrite_it(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    inp, out = write_questions(tmp_path / "prompts.jsonl", 4, "stale"), tmp_path / "out"
    # ~2 s requests: the frozen worker's requests finish on the server while it sleeps
    sim = procs.simulator(
        "--time-scale", "0.2", "--mean-output-tokens", "400", "--output-tokens-sigma", "0.05"
    )
    frozen = start_worker(procs, sim, "frozen", "--max-chunks", "1")
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "4")
    job_id = str(summary["job_id"])
    wait_until(lambda: held_by(procs, job_id, "frozen"), 30, "the worker to lease the chunk")
    time.sleep(0.5)  # its requests are on the server now
    os.kill(frozen.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        start_worker(procs, sim, "other", "--max-chunks", "1")
        wait_until(lambda: outputs(out) == {0}, 60, "the other worker to store the chunk")
        taken_over = time.monotonic() - stopped
        chunk = out / "outputs" / "chunk-000000.jsonl"
        stored = digest(chunk)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    # the woken worker finishes what it had in flight, then decides what to do with it
    wait_until(lambda: "chunk 0 of job" in logs(procs, "frozen.log"), 60, "the woken worker to finish")
    time.sleep(1.0)
    assert digest(chunk) == stored, "the stored chunk was rewritten by the worker that woke up"
    settle(
        reliability,
        procs,
        family="1",
        fault="worker SIGSTOPped mid-chunk, SIGCONT after another worker stored its chunk",
        inp=inp,
        out=out,
        runs=1,
        recover_s=taken_over,
        sims=[sim],
        allowed_waste=None,  # the frozen worker's chunk is generated again elsewhere: reported
        measured="SIGSTOP → the chunk stored by another worker",
        notes="the woken worker leaves the stored chunk as it is (found by the chaos run: it rewrote it)",
    )
