"""The dashboard against a real Prometheus scraping a live job on simulated GPUs.

``python -m workers.node --simulate`` runs two simulated GPUs with their workers and writes its
scrape targets (file-based discovery); Debian's ``prometheus`` reads them with the repo's config
(deploy/prometheus/prometheus.yml, its discovery and relabelling as they are, only the paths and
a 1 s scrape changed) and evaluates the repo's alert rules. While a job runs, with a burst of
503s and an unhealthy spell on one server, every query of every dashboard panel must return
series, and the dashboard's numbers must agree with the job's progress.json.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from tests.helpers import Processes, RedisServer, free_port, processes, wait_until, write_prompts
from tests.prometheus_support import (
    Prometheus,
    config_for,
    dashboard,
    queries,
    start_prometheus,
    stop,
    substitute,
)
from workers.node.main import port_in_use

MODEL = "Qwen/Qwen3-8B"
SAMPLES, CHUNK = 640, 16
PRICE = 4.0
# ~0.4 s requests (400 tokens at 40 tok/s, time scale 0.04), 8 in flight per simulated GPU
SIM = "--time-scale 0.04 --mean-output-tokens 400 --context-length 8192"
#: Grafana's $__rate_interval for a 1 s scrape (it is at least four scrape intervals).
RATE_INTERVAL = "5s"
#: The job figures the dashboard must show as progress.json does, at some moment of the job.
AGREED = {"samples", "cost", "accept", "yield"}
#: How long GPU 1's server answers 503 and fails its health check, from the job's start (s).
FAULT_SECONDS = 6


@dataclass
class LiveJob:
    procs: Processes
    prom: Prometheus
    out: Path
    job_id: str
    sims: list[str]
    node_log: Path

    def progress(self) -> dict[str, Any]:
        return dict(json.loads((self.out / "progress.json").read_text()))


def port_base(span: int) -> int:
    for _ in range(50):
        base = free_port()
        if base + span < 65535 and not any(port_in_use(base + i) for i in range(span)):
            return base
    raise AssertionError("no free port range")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[LiveJob]:
    tmp = tmp_path_factory.mktemp("dashboard")
    with processes(tmp, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
        procs.env["DFLASH_PROGRESS_SECONDS"] = "1"
        # the workers tune their target (from 8, at most 16), so the tuner's panel has its series
        procs.env.update(
            DFLASH_MAX_INFLIGHT="8", DFLASH_TUNE_WINDOW_SECONDS="0.5", DFLASH_TUNE_SAMPLE_SECONDS="0.1"
        )
        base, metrics = port_base(2), port_base(2)
        procs.env["DFLASH_METRICS_PORT"] = str(metrics)
        targets = tmp / "targets"
        # the servers report a tokenizer the workers can read: they count, so the yield has series
        model = build_model_dir(tmp / "models", QWEN3_TEMPLATE, "Qwen3-8B")
        sim = f"{SIM} --model-path {model} --served-model-name {MODEL}"
        node = procs.spawn(
            [
                *("-m", "workers.node", "--gpus", "0-1", "--simulate", "--port-base", str(base)),
                *(
                    "--max-inflight",
                    "auto",
                    "--inflight-ceiling",
                    "16",
                    "--sim-arg",
                    sim,
                    "--log-dir",
                    str(tmp / "logs"),
                ),
                *("--health-interval-seconds", "0.5", "--scrape-targets", str(targets / "node.json")),
            ],
            "node.log",
        )
        node_log = tmp / "node.log"
        prom = start_prometheus(tmp / "prometheus", config_for(targets))
        try:
            wait_until(lambda: "node ready: 2 GPU(s)" in node_log.read_text(), 60, "the node to be ready")
            inp, out = tmp / "prompts.jsonl", tmp / "out"
            write_prompts(inp, SAMPLES, long_at=3)  # one prompt over the context: a rejected request
            res = procs.run(
                "dflash_tasks.producer.enqueue",
                *("--input", str(inp), "--output", str(out), "--model", MODEL, "--max-tokens", "2048"),
                *("--train-max-length", "2048"),  # the horizon at the budget: no continuation rounds
                *("--chunk-size", str(CHUNK), "--no-preflight", "--gpu-hour-usd", str(PRICE), "--json"),
            )
            assert res.returncode == 0, res.stderr
            sims = [f"http://127.0.0.1:{base + gpu}" for gpu in (0, 1)]
            # as soon as the job runs (its chunks are queued): GPU 1's server answers 503 and fails
            # its health check for FAULT_SECONDS, so its worker retries, gives up, re-queues its
            # chunks and waits for the server to come back. Before anything else waits: on a busy
            # machine the job may be nearly done by the time Prometheus shows its series.
            for kind in ("http_503", "unhealthy"):
                fault = {"kind": kind, "seconds": FAULT_SECONDS}
                hit = requests.post(f"{sims[1]}/sim/faults", json=fault, timeout=5)
                assert hit.status_code == 200, hit.text
            job_id = str(json.loads(res.stdout.strip().splitlines()[-1])["job_id"])
            yield LiveJob(procs, prom, out, job_id, sims, node_log)
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(30)
            finally:
                stop(prom)


def done(job: LiveJob) -> bool:
    try:
        return bool(job.progress()["state"] == "done")
    except (OSError, ValueError):
        return False


def test_every_panel_returns_series_during_the_job_and_agrees_with_progress_json(live: LiveJob) -> None:
    started = time.monotonic()

    # every target the node wrote is scraped and up, with its GPU label
    def all_up() -> list[dict[str, Any]] | None:
        targets = live.prom.targets()
        return targets if len(targets) == 4 and all(t["health"] == "up" for t in targets) else None

    targets = wait_until(all_up, 20, "the node's 4 targets up in Prometheus", interval=0.5)
    found = {(t["labels"]["job"], t["labels"]["gpu"]) for t in targets}
    assert found == {(job, gpu) for job in ("dflash-workers", "sglang") for gpu in ("gpu0", "gpu1")}

    wait_until(lambda: live.prom.query(f'dflash_job_samples{{job="{live.job_id}"}}'), 30, "the job's series")
    values = {"job": live.job_id, "gpu": ".*", "__rate_interval": RATE_INTERVAL}
    pending = dict(queries(dashboard()))
    agreed: dict[str, str] = {}
    finished_at: float | None = None
    while pending or set(agreed) != AGREED:
        if finished_at is None and done(live):
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > 5:
            break  # the job's own figures are exported a few seconds after its last write only
        for where, expr in list(pending.items()):
            if live.prom.query(substitute(expr, values)):
                del pending[where]
        agreed |= agreement(live)
        time.sleep(0.5)
    assert not pending, f"panels whose query returned no series during the job: {sorted(pending)}"
    assert set(agreed) == AGREED, agreed

    # the re-queued chunks are there for the reason they were re-queued (a scrape or two later)
    def requeue_reasons() -> set[str]:
        found = live.prom.query("sum by (reason) (dflash_chunks_requeued_total)")
        return {str(r["metric"].get("reason")) for r in found}

    with contextlib.suppress(AssertionError):
        wait_until(lambda: "server_unhealthy" in requeue_reasons(), 10, "the unhealthy server's re-queues")
    assert "server_unhealthy" in requeue_reasons(), requeue_reasons()
    errors = {r["metric"]["kind"] for r in live.prom.query("sum by (kind) (dflash_request_errors_total)")}
    assert {"http_503", "rejected"} <= errors, errors

    # at the end: the counters against the final progress.json
    wait_until(lambda: done(live), 90, "the job to finish")
    final = live.progress()
    job = f'job="{live.job_id}"'
    time.sleep(2)  # one more scrape of the last counts
    samples = live.prom.value(f"sum(dflash_samples_total{{{job}}})")
    failed = live.prom.value(f'sum(dflash_samples_total{{{job},status="failed"}})')
    tokens = live.prom.value(f"sum(dflash_generated_tokens_total{{{job}}})")
    assert samples is not None and tokens is not None
    # per-worker counts include the samples of chunks given back and run again
    assert final["samples"]["done"] == SAMPLES <= samples <= SAMPLES * 1.15, (samples, final["samples"])
    # the rejected prompt's chunk may be one of those run again: it fails once per run
    requeued = live.prom.value("sum(dflash_chunks_requeued_total)") or 0
    assert final["samples"]["failed"] == 1 <= (failed or 0) <= 1 + requeued, (failed, requeued)
    generated = final["tokens"]["generated"]
    assert generated <= tokens <= generated * 1.15, (tokens, generated)
    spec = live.prom.value(
        f"sum(dflash_spec_tokens_total{{{job}}}) / sum(dflash_spec_verify_passes_total{{{job}}})"
    )
    assert spec == pytest.approx(final["spec"]["job"], rel=0.03)
    took = time.monotonic() - started
    print(f"live dashboard check: {took:.1f}s, {len(dict(queries(dashboard())))} queries, {agreed}")


def agreement(job: LiveJob) -> dict[str, str]:
    """The dashboard's job figures that agree with the progress.json of the same moment."""
    try:
        doc = job.progress()
    except (OSError, ValueError):
        return {}
    if doc["state"] != "running":
        return {}
    sel = f'job="{job.job_id}"'
    prom = job.prom
    agreed = {}
    # what the dashboard shows comes from a progress document a few seconds older: a scrape
    # interval and a progress write behind it, more on a loaded machine (8 s of the job's rate)
    done_now = prom.value(f'max(dflash_job_samples{{{sel},kind="done"}})')
    total = prom.value(f'max(dflash_job_samples{{{sel},kind="total"}})')
    rate = max(doc["rates"]["samples_per_s"], 1.0)
    if (
        done_now is not None
        and total == SAMPLES
        and abs(done_now - doc["samples"]["done"]) <= 8 * rate + CHUNK
    ):
        agreed["samples"] = f"{done_now:.0f} vs {doc['samples']['done']}"
    # cost: the GPU-hours behind it (the dollars of a short test job round to a cent or two)
    spent = prom.value(f'max(dflash_job_cost_usd{{{sel},kind="spent"}})')
    hours = prom.value(f"max(dflash_job_gpu_hours{{{sel}}})")
    gpu_hours, usd = doc["cost"]["gpu_hours"], doc["cost"]["usd"]
    known = spent is not None and hours is not None and gpu_hours > 0
    close = known and abs(hours - gpu_hours) <= 0.0002 + 0.25 * gpu_hours and abs(spent - usd) <= 0.011
    if close and spent == pytest.approx(PRICE * hours, abs=0.006):
        agreed["cost"] = f"{hours} vs {gpu_hours} GPU-h, ${spent} vs ${usd}"
    ratio = prom.value(f"max(dflash_job_yield_ratio{{{sel}}})")
    live_yield = (doc.get("yield") or {}).get("yield")
    if ratio is not None and live_yield and ratio == pytest.approx(live_yield, rel=0.05):
        agreed["yield"] = f"{ratio} vs {live_yield}"
    accept = prom.value(f'max(dflash_job_accept_length{{{sel},window="job"}})')
    if accept is not None and doc["spec"]["job"] and accept == pytest.approx(doc["spec"]["job"], rel=0.05):
        agreed["accept"] = f"{accept} vs {doc['spec']['job']}"
    return agreed
