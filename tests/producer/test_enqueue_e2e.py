"""The producer against a real Redis: tiny messages, no double queueing, resume after a kill."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import redis
import requests

from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.helpers import REPO, Processes, done_chunk_count, write_prompts


def test_queued_job_holds_ids_not_prompts_and_is_not_queued_twice(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    marker = "UNIQUE-PROMPT-TEXT-" + "z" * 2000
    with open(inp, "w") as fh:
        for i in range(640):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"{marker} {i}"}) + "\n")
    first = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json", "--no-preflight"))
    assert first.returncode == 0, first.stderr
    assert last_json(first.stdout)["chunks_enqueued"] == 10
    second = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--json", "--no-preflight"))
    summary = last_json(second.stdout)
    assert summary["chunks_enqueued"] == 0 and summary["chunks_queued_before"] == 10

    r = redis.Redis.from_url(procs.broker_url)
    assert r.llen(procs.model_queue()) == 10
    per_chunk = int(r.memory_usage(procs.model_queue()) or 0) / 10
    assert per_chunk < 4096, f"{per_chunk:.0f} bytes per queued chunk"
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        values = r.lrange(key, 0, -1) if kind == b"list" else [r.dump(key) or b""]
        assert not any(b"UNIQUE-PROMPT-TEXT" in v for v in values), key
    staged = (out / "inputs" / "chunk-000000.jsonl").read_text()
    assert marker in staged


def test_dry_run_writes_and_queues_nothing(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 130, bad_every=13)
    res = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--dry-run", "--json"))
    assert res.returncode == 0, res.stderr
    summary = last_json(res.stdout)
    assert (summary["samples"], summary["invalid"], summary["chunks"]) == (120, 10, 2)
    assert summary["chunks_enqueued"] == 0 and "would queue 2" in res.stderr
    assert not out.exists()
    assert redis.Redis.from_url(procs.broker_url).llen(procs.model_queue()) == 0


def test_server_stays_busy_across_chunk_boundaries(procs: Processes, tmp_path: Path) -> None:
    """The next chunk fills the slots while one drains its slowest requests."""
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 80)
    sim = procs.simulator(
        *("--time-scale", "0.05", "--max-running-requests", "8"),
        *("--mean-output-tokens", "600", "--output-tokens-sigma", "0.8"),
    )
    procs.worker(sim, "gpu0", "--max-inflight", "8", "--max-chunks", "4")
    args = [
        sys.executable,
        "-m",
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "8", "--wait", "--no-preflight"),
    ]
    producer = subprocess.Popen(
        args, cwd=REPO, env=procs.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    r = redis.Redis.from_url(procs.broker_url)
    samples: list[tuple[int, int]] = []  # (running requests, chunks still in the queue)
    while producer.poll() is None:
        stats = requests.get(f"{sim}/sim/stats", timeout=5).json()
        samples.append((stats["running"], r.llen(procs.model_queue())))
        time.sleep(0.02)
    assert producer.returncode == 0 and done_chunk_count(out) == 10
    # From the first full batch until the last chunk left the queue (before the final drain),
    # the server should be at its in-flight target nearly all the time.
    first_full = next(i for i, (running, _) in enumerate(samples) if running == 8)
    last_queued = max(i for i, (_, queued) in enumerate(samples) if queued > 0)
    middle = [running for running, _ in samples[first_full:last_queued]]
    assert len(middle) > 50
    occupancy = sum(middle) / (8 * len(middle))
    assert occupancy > 0.85, f"mean running {occupancy * 8:.2f} of 8 over {len(middle)} samples"


def test_enqueue_reports_bad_arguments_clearly(procs: Processes, tmp_path: Path) -> None:
    inp = tmp_path / "prompts.jsonl"
    write_prompts(inp, 5)
    missing = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(tmp_path / "nope.jsonl", tmp_path / "o")
    )
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr and "not found" in missing.stderr
    bad_top_p = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, tmp_path / "o", "--top-p", "0"))
    assert bad_top_p.returncode == 2 and "--top-p must be in (0, 1]" in bad_top_p.stderr
    start = time.monotonic()
    env_broker = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, tmp_path / "o2", "--broker-url", "redis://:s3cret@127.0.0.1:1/0"),
    )
    assert env_broker.returncode == 2 and "s3cret" not in env_broker.stderr
    assert "connecting to the broker" in env_broker.stderr and not (tmp_path / "o2").exists()
    assert time.monotonic() - start < 30
