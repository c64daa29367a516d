"""The SGLang server misbehaving: killed and restarted, 500s, 503 queue full, hangs longer than the
client timeout, truncated JSON, ``finish_reason: "abort"``, connection resets.

Each transient fault costs exactly one more request for the sample it hits (the simulator
counts them), and the sample is stored once, ok. Generation is wasted only where the simulator
did the work before failing the request (a truncated body, an abort, a hang outliving the
client's timeout): exactly one generation per hit. An abort is never stored as a good sample: a
persistent one ends as a failed record whose error names the abort.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import (
    Processes,
    RedisServer,
    free_port,
    generation,
    processes,
    read_records,
    sim_requests,
    wait_until,
)
from tests.reliability.support import (
    Collector,
    enqueue_ok,
    fault,
    kill_group,
    logs,
    outputs,
    reset_sim_stats,
    settle,
    sim_stats,
    start_simulator,
    start_worker,
    wait_done,
    write_questions,
)

pytestmark = pytest.mark.reliability

CLIENT_TIMEOUT = 2  # DFLASH_REQUEST_TIMEOUT of this module's worker: a hang of 4 s outlives it
ATTEMPTS = 8  # DFLASH_REQUEST_ATTEMPTS (tests.helpers.FAST_ENV)


@dataclass
class Server:
    procs: Processes
    sim: str
    tmp: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("sglang-faults")
    with processes(tmp, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
        procs.env["DFLASH_REQUEST_TIMEOUT"] = str(CLIENT_TIMEOUT)
        sim = procs.simulator("--time-scale", "0.001")
        start_worker(procs, sim, "faults-gpu0")
        yield Server(procs, sim, tmp)


TRANSIENT = {
    "http_500": ("HTTP 500", {}),
    "http_503": ("HTTP 503 queue full", {}),
    "hang": (f"hang 4 s > client timeout {CLIENT_TIMEOUT} s", {"hang_seconds": 4}),
    "bad_json": ("truncated (invalid) JSON body", {}),
    "abort": ('finish_reason "abort" (transient)', {}),
    "reset": ("connection reset", {}),
}
#: Faults the simulator answers after generating (a hung request generates once the hang ends).
GENERATED_THEN_FAILED = {"hang", "bad_json", "abort"}


@pytest.mark.parametrize("kind", list(TRANSIENT))
def test_transient_server_fault_is_retried_once_per_hit(
    server: Server, reliability: Collector, kind: str
) -> None:
    label, extra = TRANSIENT[kind]
    hits = 4 if kind == "hang" else 6
    procs, sim = server.procs, server.sim
    inp, out = write_questions(server.tmp / f"{kind}.jsonl", 24, kind), server.tmp / f"out-{kind}"
    reset_sim_stats(sim)
    fault(sim, kind, count=hits, **extra)
    enqueue_ok(procs, inp, out, "--chunk-size", "8", "--wait")
    stats = sim_stats(sim)
    records = read_records(out)
    retried = [r for r in records if r["attempts"] > 1]
    assert stats["faults_injected"] == hits, stats
    assert all(r["status"] == "ok" and r["finish_reason"] != "abort" for r in records)
    assert sum(r["attempts"] - 1 for r in records) == hits
    wasted = hits if kind in GENERATED_THEN_FAILED else 0
    # a hung request generates after the job is done: wait for it before counting
    wait_until(lambda: generation(inp, [sim]).generated >= 24 + wasted, 30, "the simulator to finish")
    acc = settle(
        reliability,
        procs,
        family="6",
        fault=f"SGLang {label} x{hits}",
        inp=inp,
        out=out,
        runs=hits,
        recover_s=max(r["latency_s"] for r in retried),
        measured="a hit sample: first attempt → good answer (worst)",
        notes=f"{stats['requests_total']} requests for 24 samples: one retry per hit, all ok",
        sims=[sim],
        allowed_waste=wasted,
    )
    assert stats["requests_total"] == 24 + hits, stats
    assert acc.wasted == wasted and acc.generated == 24 + wasted, acc


def test_persistent_abort_is_a_failed_sample_never_a_good_one(server: Server, reliability: Collector) -> None:
    procs, sim = server.procs, server.sim
    inp, out = (
        write_questions(server.tmp / "abort-always.jsonl", 3, "abort-always"),
        server.tmp / "out-abort-always",
    )
    reset_sim_stats(sim)
    fault(sim, "abort", count=3 * ATTEMPTS)
    procs.env["DFLASH_REPAIR_ROUNDS"] = "0"  # the first pass's records: no repair round regenerates them
    try:
        enqueue_ok(procs, inp, out, "--wait")
    finally:
        del procs.env["DFLASH_REPAIR_ROUNDS"]
    records = read_records(out)
    assert [r["status"] for r in records] == ["failed"] * 3
    assert all("finish_reason 'abort'" in r["error"] and r["attempts"] == ATTEMPTS for r in records), records
    assert not any(t["content"] or t["reasoning"] for r in records for t in r["turns"])
    acc = settle(
        reliability,
        procs,
        family="6",
        fault='SGLang finish_reason "abort" on every attempt',
        inp=inp,
        out=out,
        runs=3 * ATTEMPTS,
        recover_s=None,
        notes=f"3 failed records, error: {records[0]['error']}; none stored as ok",
        sims=[sim],
        allowed_waste=3 * (ATTEMPTS - 1),  # every attempt was generated (half-way) and thrown away
    )
    assert sim_stats(sim)["requests_total"] == 3 * ATTEMPTS
    assert acc.wasted == 3 * (ATTEMPTS - 1)


def test_server_killed_and_restarted_on_the_same_port(
    procs: Processes, tmp_path: Path, reliability: Collector
) -> None:
    inp, out = write_questions(tmp_path / "prompts.jsonl", 120, "restart"), tmp_path / "out"
    port = free_port()
    flags = ("--time-scale", "0.02", "--mean-output-tokens", "800")
    sim, server_proc = start_simulator(procs, *flags, name="sim", port=port)
    # a name of its own: control commands (the health gate's cancel/add consumer) go by name
    start_worker(procs, sim, "restart-gpu0", "--max-inflight", "16", "--max-chunks", "2")
    summary = enqueue_ok(procs, inp, out, "--chunk-size", "8")
    chunks = int(summary["chunks"])
    wait_until(lambda: len(outputs(out)) >= 2, 60, "the first chunks")
    before = sim_requests(sim)  # what the first server generated dies with it
    kill_group(server_proc)
    time.sleep(2.0)
    start_simulator(procs, *flags, name="sim-restarted", port=port)
    restarted = time.monotonic()
    stored = outputs(out)
    wait_until(lambda: outputs(out) - stored, 60, "a chunk stored after the restart")
    back = time.monotonic() - restarted
    wait_done(out, chunks, 120)
    log = logs(procs, "restart-gpu0.log")
    requeued = log.count("re-queued")
    settle(
        reliability,
        procs,
        family="6",
        fault="SGLang server SIGKILLed, restarted on the same port after 2 s",
        inp=inp,
        out=out,
        runs=1,
        recover_s=back,
        measured="server back → next chunk stored",
        notes=f"in-flight requests retried; {requeued} chunk re-queues; "
        + (
            "worker paused until healthy" if "pausing this worker's consumption" in log else "no pause needed"
        ),
        sims=[before, sim],
        allowed_waste=2 * 8,  # at most the two running chunks' samples generated again
    )
    assert all(r["status"] == "ok" for r in read_records(out))
