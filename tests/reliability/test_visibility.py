"""A visibility timeout shorter than a chunk: the broker delivers a running chunk twice.

Redis's ack emulation puts back any delivery older than the visibility timeout (when a consumer
starts, and every ~30 s). With the default (12 h) that never meets a live chunk; forced down to
4 s here, it does. The second delivery must cost one Redis call: refused by the chunk's live
lease before any request reaches the server, and the store still holds each sample once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Processes, free_port, wait_until
from tests.reliability.support import (
    Collector,
    enqueue_ok,
    held_by,
    logs,
    settle,
    sim_stats,
    start_worker,
    wait_done,
    write_questions,
)

pytestmark = pytest.mark.reliability

SKIP_LEASED = ": skipped running elsewhere (live lease)"  # the worker's own log line


def metric(port: int, name: str, **labels: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_visibility_timeout_shorter_than_a_chunk_duplicates_cost_nothing(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    vt = 4
    procs.env.update({"DFLASH_VISIBILITY_TIMEOUT": str(vt), "DFLASH_LEASE_SECONDS": "3"})
    inp, out = write_questions(tmp_path / "prompts.jsonl", 8, "vt"), tmp_path / "out"
    # ~10 s per request: each chunk runs well past the visibility timeout
    sim = procs.simulator(
        *("--time-scale", "0.4", "--mean-output-tokens", "1000", "--output-tokens-sigma", "0.05")
    )
    start_worker(procs, sim, "first", "--max-inflight", "8", "--max-chunks", "2")
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "4")
    job_id, chunks = str(summary["job_id"]), int(summary["chunks"])
    wait_until(lambda: len(held_by(procs, job_id, "first")) == chunks, 30, "both chunks leased")
    leased_at = time.monotonic()
    time.sleep(max(0.0, vt + 0.5 - (time.monotonic() - leased_at)))
    # A consumer starting now restores every delivery older than the visibility timeout.
    port = free_port()
    start_worker(procs, sim, "second", "--max-inflight", "8", env={"DFLASH_METRICS_PORT": str(port)})
    wait_until(lambda: SKIP_LEASED in logs(procs, "first.log", "second.log"), 30, "a duplicate delivery")
    assert not set(held_by(procs, job_id, "second")), "the duplicate delivery took the lease"
    skipped = metric(port, "dflash_chunks_total", outcome="skipped_leased")
    redelivered = metric(port, "dflash_redeliveries_total")
    wait_done(out, chunks, 60)
    stats = sim_stats(sim)
    duplicates = logs(procs, "first.log", "second.log").count(SKIP_LEASED)
    settle(
        reliability,
        procs,
        family="5",
        fault=f"visibility timeout {vt} s < chunk time (~10 s): duplicate deliveries",
        inp=inp,
        out=out,
        runs=duplicates,
        recover_s=None,
        notes=f"{duplicates} duplicate deliveries ({redelivered:.0f} flagged redelivered), each refused by "
        f"the live lease; {stats['requests_total']} requests for 8 samples (no extra generation)",
        sims=[sim],
    )
    assert duplicates >= 1 and skipped >= 1 and redelivered >= 1
    assert stats["requests_total"] == 8, stats
