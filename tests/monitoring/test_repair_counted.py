"""A repair round's samples reach the worker's monitoring as a chunk's do.

Real processes: a simulator, a worker that runs the first pass through a burst of 500s (some
samples stored failed), then a second worker, with its metrics endpoint and the in-flight tuner,
that runs the repair round alone. Everything the second worker counted is the round's: its
Prometheus counters, its live counts and rates in Redis (``status --json``) and its tuner's
completed tokens must all equal the tokens of the round's file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Processes, free_port
from tests.reliability.support import (
    enqueue_ok,
    fault,
    kill_group,
    prefix,
    redis_client,
    start_worker,
    write_questions,
)

SAMPLES, CHUNK = 24, 8
FAILED = 3  # samples whose two attempts both meet the burst (one request at a time)


def scraped(port: int, job_id: str) -> dict[str, float]:
    """The worker's counters of ``job_id`` on its metrics endpoint, summed over their other labels."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") == job_id and sample.name.endswith("_total"):
                key = sample.name + (f"|{sample.labels['status']}" if "status" in sample.labels else "")
                found[key] = found.get(key, 0.0) + sample.value
    return found


def worker_row(procs: Processes, out: Path, name: str) -> dict[str, Any]:
    """The worker's row of ``status --json`` (empty when it counted nothing of the job)."""
    res = procs.run("dflash_tasks.monitoring.status", "--output", str(out), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    rows = [w for w in doc["workers"] if str(w["name"]).startswith(f"{name}@")]
    return dict(rows[0]) if rows else {}


def tuner_state(procs: Processes, name: str) -> dict[str, Any]:
    """The in-flight tuner's state in the worker's heartbeat (``P:worker:W``)."""
    client = redis_client(procs)
    (key,) = client.scan_iter(match=f"{prefix(procs)}:worker:{name}@*")
    return dict(json.loads(client.hget(key, "tuner") or b"{}"))


def test_a_repair_rounds_samples_reach_prometheus_the_live_counts_and_the_tuner(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = write_questions(tmp_path / "mon.jsonl", SAMPLES, "mon"), tmp_path / "out"
    sim = procs.simulator("--time-scale", "0.001")
    first = start_worker(
        procs, sim, "first-gpu0", env={"DFLASH_REQUEST_ATTEMPTS": "2", "DFLASH_MAX_INFLIGHT": "1"}
    )
    fault(sim, "http_500", count=2 * FAILED)
    procs.env["DFLASH_REPAIR_ROUNDS"] = "0"  # the first pass alone
    try:
        job_id = str(enqueue_ok(procs, inp, out, "--chunk-size", str(CHUNK), "--wait")["job_id"])
    finally:
        del procs.env["DFLASH_REPAIR_ROUNDS"]
    kill_group(first)  # the round runs on the second worker alone

    port = free_port()
    env = {"DFLASH_METRICS_PORT": str(port), "DFLASH_MAX_INFLIGHT": "auto"}
    start_worker(procs, sim, "repair-gpu0", env=env)
    enqueue_ok(procs, inp, out, "--chunk-size", str(CHUNK), "--wait")

    repaired = [
        json.loads(line)
        for p in (out / "outputs").glob("*.repair-1.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert len(repaired) == FAILED and all(r["status"] == "ok" for r in repaired), repaired
    # one-turn samples regenerated from their first turn: the round sent every token of its records
    tokens = sum(r["usage"]["completion_tokens"] for r in repaired)
    prompt = sum(r["usage"]["prompt_tokens"] for r in repaired)
    assert tokens > 0
    expected = (FAILED, tokens, prompt, FAILED, tokens, True, tokens)

    def seen() -> tuple[Any, ...]:
        prom, row = scraped(port, job_id), worker_row(procs, out, "repair-gpu0")
        return (
            prom.get("dflash_samples_total|ok", 0),
            prom.get("dflash_generated_tokens_total", 0),
            prom.get("dflash_prompt_tokens_total", 0),
            row.get("samples", 0),
            row.get("tokens", 0),
            row.get("tokens_per_s", 0) > 0,  # the live rate of the last minute
            tuner_state(procs, "repair-gpu0").get("completed_tokens"),
        )

    # the worker pushes its live counts every couple of seconds; a rate counts closed 5 s buckets
    deadline = time.monotonic() + 20
    while (got := seen()) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    # (Prometheus samples, tokens, prompt tokens; live samples, tokens, a rate; the tuner's tokens)
    assert got == expected
