"""Watching a run, end to end: progress.json, status, Flower in a real browser, Prometheus.

One job runs once for the module (a simulator, two real workers with metrics ports, Flower with
basic auth, ``enqueue --wait``); the tests then look at it through each window. A second job
checks that progress.json keeps moving after the producer is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from dflash_tasks.core.record import Record
from dflash_tasks.core.spec_stats import spec_counts as counts_of
from tests.helpers import (
    REPO,
    Processes,
    RedisServer,
    free_port,
    processes,
    read_records,
    wait_until,
    write_prompts,
)


def spec_counts(doc: dict[str, Any]) -> tuple[int, int]:
    """The speculative-decoding counts of a stored record (a decoded chunk file line)."""
    return counts_of(Record.from_dict(doc))


MODEL = "Qwen/Qwen3-8B"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"
PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]
SAMPLES, CHUNK = 240, 20
PRICE = 2.5


@dataclass
class FinishedJob:
    procs: Processes
    out: Path
    job_id: str
    flower_url: str
    flower: subprocess.Popen[bytes]
    metrics_ports: dict[str, int]
    records: list[dict[str, Any]]


def last_json(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[FinishedJob]:
    tmp = tmp_path_factory.mktemp("monitoring")
    with processes(tmp, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
        procs.env["DFLASH_PROGRESS_SECONDS"] = "1"
        inp, out = tmp / "prompts.jsonl", tmp / "out"
        write_prompts(inp, SAMPLES, long_at=5)  # one prompt longer than the context: one failed sample
        sim = procs.simulator(
            "--time-scale", "0.003", "--mean-output-tokens", "600", "--context-length", "8192"
        )
        flower_port = free_port()
        flower = _spawn_flower(procs, flower_port)
        ports = {name: free_port() for name in ("gpu0", "gpu1")}
        for name, port in ports.items():
            procs.worker(sim, name, "--metrics-port", str(port))
        url = f"http://127.0.0.1:{flower_port}"
        wait_until(lambda: _answers(f"{url}/healthcheck"), 30, "Flower to answer")
        res = procs.run(
            "dflash_tasks.producer.enqueue",
            *("--input", str(inp), "--output", str(out), "--model", MODEL, "--max-tokens", "2048"),
            *("--train-max-length", "2048"),  # the horizon at the budget: no continuation rounds
            *("--chunk-size", str(CHUNK), "--no-preflight", "--gpu-hour-usd", str(PRICE), "--wait", "--json"),
        )
        assert res.returncode == 0, res.stderr
        job_id = str(last_json(res.stdout)["job_id"])
        yield FinishedJob(procs, out, job_id, url, flower, ports, read_records(out))


def _spawn_flower(procs: Processes, port: int) -> subprocess.Popen[bytes]:
    procs.env["DFLASH_FLOWER_PASSWORD"] = PASSWORD
    try:
        return procs.spawn(["-m", "dflash_tasks.flower", "--port", str(port)], "flower.log")
    finally:
        del procs.env["DFLASH_FLOWER_PASSWORD"]


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


# --- (b) status --json against known counts -----------------------------------------------------


def status_json(job: FinishedJob) -> dict[str, Any]:
    res = job.procs.run("dflash_tasks.monitoring.status", "--output", str(job.out), "--json")
    assert res.returncode == 0, res.stderr
    return last_json(res.stdout)


def test_status_json_numbers_match_the_job(job: FinishedJob) -> None:
    # the workers push their own counts within a moment of storing a chunk
    def settled() -> dict[str, Any] | None:
        doc = status_json(job)
        return doc if sum(w["samples"] for w in doc["workers"]) == SAMPLES else None

    doc = wait_until(settled, 10, "the workers' last counts", interval=0.5)
    ok = [r for r in job.records if r["status"] == "ok"]
    tokens = sum(r["usage"]["completion_tokens"] for r in job.records)
    assert doc["job_id"] == job.job_id and doc["state"] == "done" and doc["model"] == MODEL
    assert doc["samples"] == {
        "total": SAMPLES,
        "done": SAMPLES,
        "ok": SAMPLES - 1,
        "failed": 1,
        "repaired": 0,  # the failed sample is a 400: permanent, never repaired
        "remaining": 0,
        "invalid_lines": 0,
    }
    assert len(ok) == SAMPLES - 1
    assert doc["chunks"] == {"total": SAMPLES // CHUNK, "done": SAMPLES // CHUNK, "running": 0, "pending": 0}
    assert doc["queue_depth"] == 0 and doc["eta_s"] == 0
    assert doc["tokens"]["generated"] == tokens
    assert doc["tokens"]["avg_per_sample"] == pytest.approx(tokens / len(ok), abs=0.1)
    workers = {w["name"].split("@")[0]: w for w in doc["workers"]}
    assert set(workers) == {"gpu0", "gpu1"}
    assert sum(w["samples"] for w in workers.values()) == SAMPLES
    assert sum(w["chunks"] for w in workers.values()) == SAMPLES // CHUNK
    assert all(w["alive"] for w in workers.values())
    # the accept length is Σ tokens / Σ verify passes of the stored samples' own meta_info
    spec_tokens, verify = (sum(pair[i] for pair in map(spec_counts, job.records)) for i in (0, 1))
    assert verify > 0 and doc["spec"]["source"] == "per_request"
    assert doc["spec_accept_length"] == doc["spec"]["job"] == round(spec_tokens / verify, 3)
    assert doc["spec"]["verify_passes"] == verify
    for name, w in workers.items():
        mine = [spec_counts(r) for r in job.records if r["worker"].startswith(f"{name}@")]
        assert w["spec_accept_source"] == "per_request"
        assert w["spec_accept_length"] == round(sum(t for t, _ in mine) / sum(v for _, v in mine), 3)
    cost = doc["cost"]
    assert cost["gpu_hour_usd"] == PRICE and cost["gpus"] == 2 and cost["gpu_hours"] > 0
    assert cost["gpu_hours"] <= 2 * doc["elapsed_s"] / 3600 + 0.001
    assert cost["usd"] == pytest.approx(PRICE * cost["gpu_hours"], abs=0.01)
    assert doc["elapsed_s"] > 0 and doc["finished_at"] >= doc["started_at"]
    # progress.json, written by whichever process was alive, says the same
    progress = json.loads((job.out / "progress.json").read_text())
    assert progress["state"] == "done" and progress["samples"] == doc["samples"]
    assert progress["tokens"] == doc["tokens"] and progress["chunks"] == doc["chunks"]

    human = job.procs.run("dflash_tasks.monitoring.status", "--output", str(job.out), "--gpu-hour-usd", "10")
    assert human.returncode == 0, human.stderr
    assert f"{SAMPLES:,} / {SAMPLES:,} samples" in human.stdout and "done" in human.stdout
    assert "x $10.00/GPU-h" in human.stdout and "gpu0@" in human.stdout and "gpu1@" in human.stdout


def test_status_without_a_job_says_so(tmp_path: Path, job: FinishedJob) -> None:
    res = job.procs.run("dflash_tasks.monitoring.status", "--output", str(tmp_path / "nothing"))
    assert res.returncode == 2 and "holds no job" in res.stderr


# --- (e) the workers' Prometheus endpoints ------------------------------------------------------


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def total(metrics: list[dict[str, list[tuple[dict[str, str], float]]]], name: str, **labels: str) -> float:
    return sum(
        value
        for m in metrics
        for got, value in m.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    )


def test_worker_metrics_after_the_job(job: FinishedJob) -> None:
    scraped = [scrape(port) for port in job.metrics_ports.values()]
    tokens = sum(r["usage"]["completion_tokens"] for r in job.records)
    chunks = SAMPLES // CHUNK
    assert total(scraped, "dflash_samples_total", job=job.job_id, status="ok") == SAMPLES - 1
    assert total(scraped, "dflash_samples_total", job=job.job_id, status="failed") == 1
    assert total(scraped, "dflash_generated_tokens_total", job=job.job_id) == tokens
    assert total(scraped, "dflash_request_errors_total", kind="rejected") == 1
    assert total(scraped, "dflash_chunks_total", outcome="done") == chunks
    assert total(scraped, "dflash_chunk_seconds_count") == chunks
    assert 0 < total(scraped, "dflash_chunk_seconds_sum") < 60 * chunks
    for name, m in zip(job.metrics_ports, scraped, strict=True):
        (info,) = m["dflash_worker_info"]
        assert info[0]["worker"].startswith(f"{name}@") and info[0]["endpoint"].startswith(
            "http://127.0.0.1:"
        )
        depths = [({"queue": job.procs.model_queue()}, 0.0), ({"queue": job.procs.queue}, 0.0)]
        assert sorted(m["dflash_queue_depth"], key=str) == sorted(depths, key=str)
        assert total([m], "dflash_inflight_requests") == 0 and total([m], "dflash_waiting_requests") == 0
        assert total([m], "dflash_server_healthy") == 1
        mine = [spec_counts(r) for r in job.records if r["worker"].startswith(f"{name}@")]
        assert total([m], "dflash_spec_tokens_total", job=job.job_id) == sum(t for t, _ in mine)
        assert total([m], "dflash_spec_verify_passes_total", job=job.job_id) == sum(v for _, v in mine)
        [(labels, accept)] = m["dflash_spec_accept_length"]  # one series, named by its source
        assert labels["source"] in ("per_request", "server_lifetime") and 1 < accept <= 4
        assert "dflash_chunks_requeued_total" not in m or total([m], "dflash_chunks_requeued_total") == 0


# --- (a) Flower in a real browser ---------------------------------------------------------------


def test_flower_requires_auth_and_keeps_the_password_off_argv(job: FinishedJob) -> None:
    assert requests.get(f"{job.flower_url}/workers", timeout=5).status_code == 401
    assert requests.get(f"{job.flower_url}/workers", auth=("admin", "wrong"), timeout=5).status_code == 401
    assert requests.get(f"{job.flower_url}/workers", auth=("admin", PASSWORD), timeout=5).status_code == 200
    cmdline = Path(f"/proc/{job.flower.pid}/cmdline").read_bytes()
    assert b"flower" in cmdline and PASSWORD.encode() not in cmdline
    log = (job.procs.tmp / "flower.log").read_text()
    assert PASSWORD not in log and "user admin" in log


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: `make test` installs it")
def test_flower_in_a_browser_shows_workers_and_chunk_tasks(job: FinishedJob) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (a dev dependency) is missing")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                http_credentials={"username": "admin", "password": PASSWORD},
                viewport={"width": 1400, "height": 900},
            )
            page = context.new_page()
            response = page.goto(f"{job.flower_url}/workers")
            assert response is not None and response.status == 200
            for name in job.metrics_ports:
                page.wait_for_selector(f"text=/{name}@/", timeout=15_000)
            page.screenshot(path=str(ARTIFACTS / "flower-workers.png"), full_page=True)

            page.goto(f"{job.flower_url}/tasks")
            page.wait_for_selector("text=dflash.run_chunk", timeout=15_000)
            page.wait_for_selector(f"text=/{job.job_id}/", timeout=15_000)
            body = page.inner_text("body")
            assert "SUCCESS" in body.upper()
            assert "Question" not in body  # prompt text never reaches Flower
            page.screenshot(path=str(ARTIFACTS / "flower.png"), full_page=True)

            page.click(f"text=/{job.job_id}-000003-/")  # one task's page: its args are (job id, chunk)
            page.wait_for_selector("text=Arguments", timeout=15_000)
            detail = page.inner_text("body")
            assert f"'{job.job_id}', 3" in detail and "samples_ok" in detail
            assert "Question" not in detail
        finally:
            browser.close()
    assert (ARTIFACTS / "flower.png").stat().st_size > 10_000


# --- (c) progress.json outlives the producer -----------------------------------------------------


def read_progress(out: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((out / "progress.json").read_text()))
    except (OSError, ValueError):
        return None


def test_progress_json_keeps_updating_after_enqueue_is_killed(procs: Processes, tmp_path: Path) -> None:
    procs.env["DFLASH_PROGRESS_SECONDS"] = "1"
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 150)
    sim = procs.simulator("--time-scale", "0.02", "--mean-output-tokens", "800")
    procs.worker(sim, "gpu0", "--max-inflight", "12", "--max-chunks", "2")
    producer = subprocess.Popen(
        [
            *(sys.executable, "-m", "dflash_tasks.enqueue", "--input", str(inp), "--output", str(out)),
            *("--model", MODEL, "--chunk-size", "10", "--no-preflight", "--wait"),
        ],
        cwd=REPO,
        env=procs.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (read_progress(out) or {}).get("samples", {}).get("done", 0) > 0, 60, "progress")
        os.killpg(producer.pid, signal.SIGKILL)
        producer.wait(10)
        killed_at = time.time()
        before = read_progress(out)
        assert before is not None and before["state"] == "running"

        def moved_on() -> dict[str, Any] | None:
            doc = read_progress(out)
            if (
                doc
                and doc["updated_at"] > killed_at + 1
                and doc["samples"]["done"] > before["samples"]["done"]
            ):
                return doc
            return None

        later = wait_until(moved_on, 30, "progress.json to move on without the producer")
        assert later["writer"].startswith("gpu0@")
        assert later["rates"]["since_start"]["samples_per_s"] > 0 and later["eta_s"] is not None

        mid = last_json(procs.run("dflash_tasks.monitoring.status", "--output", str(out), "--json").stdout)
        c = mid["chunks"]
        assert c["done"] + c["running"] + c["pending"] == c["total"] == 15
        assert mid["samples"]["done"] == 10 * c["done"]

        final = wait_until(
            lambda: (read_progress(out) or {}).get("state") == "done" and read_progress(out), 90, "done"
        )
        assert final["samples"]["done"] == 150 and final["chunks"]["done"] == 15 and final["eta_s"] == 0
    finally:
        if producer.poll() is None:
            os.killpg(producer.pid, signal.SIGKILL)
