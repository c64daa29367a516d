"""The in-flight target end to end: a real worker process, a simulator, a job.

The bound from above: a worker never has more requests open at its server than its target (the
simulator's own peak of running requests, with room for far more). The tuner: on a curve that rises
until the ceiling, ``--max-inflight auto`` climbs there, and says so in its log, progress.json,
``status`` and Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import requests

from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.helpers import REPO, Processes, free_port, wait_until, write_prompts


def run_job(procs: Processes, inp: Path, out: Path, *extra: str) -> dict[str, object]:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_tasks.producer.enqueue",
            *enqueue_args(inp, out, "--wait", "--json", "--no-preflight", "--chunk-size", "16", *extra),
        ],
        cwd=REPO,
        env=procs.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return last_json(res.stdout)


def test_a_worker_never_has_more_requests_open_than_its_target(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 160)
    # room for 64 at the server, and 500s to retry: retries must not open extra requests either
    sim = procs.simulator(
        *("--max-running-requests", "64", "--time-scale", "0.02", "--mean-output-tokens", "300"),
        *("--fault", "http_500:12"),
    )
    procs.worker(sim, "gpu0", "--max-inflight", "6", "--max-chunks", "6")
    summary = run_job(procs, inp, out)
    assert summary["chunks"] == 10
    stats = requests.get(f"{sim}/sim/stats", timeout=5).json()
    assert stats["completed"] == 160
    assert stats["peak_running"] == 6, stats  # reached, never passed


def test_the_tuner_climbs_a_rising_curve_to_its_ceiling_and_shows_it(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    # long enough to settle even when the load holds a few ramp windows (short: not judged)
    write_prompts(inp, 2700)
    # throughput grows with the batch all the way (no compute knee below 1000): the best is the ceiling
    sim = procs.simulator(
        *("--max-running-requests", "64", "--time-scale", "0.01", "--mean-output-tokens", "400"),
        *("--batch-knee", "1000"),
    )
    port = free_port()
    procs.env.update(
        # 0.3 s windows read a CPU-starved simulator's admission lag as a queue under load (running
        # 12, queued 5 at 21: the climb settled at 14); 0.6 s, and a job long enough to climb at it
        DFLASH_TUNE_WINDOW_SECONDS="0.6",
        DFLASH_TUNE_SAMPLE_SECONDS="0.05",
        DFLASH_METRICS_PORT=str(port),
        DFLASH_PROGRESS_SECONDS="0.5",
        DFLASH_MAX_INFLIGHT="6",  # where the tuner starts
    )
    procs.worker(
        sim, "gpu0", *("--max-inflight", "auto", "--inflight-ceiling", "24", "--inflight-floor", "4")
    )
    procs.env["DFLASH_METRICS_PORT"] = "0"
    run_job(procs, inp, out)

    log = (procs.tmp / "gpu0.log").read_text()
    assert "tuned 4-24 (from 6) in flight" in log
    moves = [line.split("in-flight tuner: ", 1)[1] for line in log.splitlines() if "in-flight tuner:" in line]
    assert moves and moves[0].startswith("6 -> 9 (climbing: throughput rising)"), moves
    # it reaches the ceiling; under load a window there can read lower and it settles just below
    assert any(m.split(" (")[0].endswith("-> 24") for m in moves), moves
    assert any("(settled: " in m for m in moves), moves
    stats = requests.get(f"{sim}/sim/stats", timeout=5).json()
    assert stats["peak_running"] <= 24

    progress = json.loads((out / "progress.json").read_text())
    (worker,) = progress["workers"]
    assert worker["max_inflight"] == worker["tuner"]["target"] >= 18
    assert worker["tuner"]["phase"] in ("settled", "probing up", "probing down")
    assert worker["tuner"]["ceiling"] == 24
    assert 24 in [p["target"] for p in worker["tuner"]["curve"]]

    status = procs.run("dflash_tasks.status", "--output", str(out))
    assert status.returncode == 0, status.stderr
    line = r"gpu0@\S* in-flight (settled|probing \w+) on \d+ \([^)]+\); measured 6: "
    assert re.search(line, status.stdout), status.stdout

    metrics = wait_until(
        lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text, 10, "metrics"
    )
    worker_label = r'worker="gpu0@[^"]*"'
    assert re.search(
        r'^dflash_max_inflight_requests\{endpoint="[^"]+",' + worker_label + r"\} \d+\.0$", metrics, re.M
    )
    assert re.search(
        r'^dflash_tuner_tokens_per_second\{target="24",' + worker_label + r"\} [1-9]", metrics, re.M
    )
    assert re.search(r'^dflash_tuner_phase\{phase="[a-z ]+",reason="[^"]+",' + worker_label, metrics, re.M)


def test_the_exported_target_is_the_pools_current_one_not_its_ceiling(procs: Processes) -> None:
    sim = procs.simulator("--max-running-requests", "64")
    port = free_port()
    procs.env.update(DFLASH_METRICS_PORT=str(port), DFLASH_MAX_INFLIGHT="6")  # the tuner starts at 6
    procs.worker(
        sim, "gpu0", *("--max-inflight", "auto", "--inflight-ceiling", "24", "--inflight-floor", "4")
    )
    procs.env["DFLASH_METRICS_PORT"] = "0"

    def exported() -> str | None:  # no job: no window is measured, the target stays where it started
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        found = re.search(
            r'^dflash_max_inflight_requests\{[^}]*worker="gpu0@[^"]*"[^}]*\} (\S+)$', text, re.M
        )
        return found.group(1) if found else None

    assert float(wait_until(exported, 10, "dflash_max_inflight_requests")) == 6.0  # not the ceiling, 24
    assert "tuned 4-24 (from 6) in flight" in (procs.tmp / "gpu0.log").read_text()
