"""Routing by model with real processes: two simulated servers serving different models, their
workers on one Redis; a job's requests reach only servers of its model (docs/routing.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
import requests
from celery import Celery

from dflash_tasks.coord.celery_app import configure
from dflash_tasks.coord.publish import publish_chunks, queued_chunks
from dflash_tasks.core.settings import CommonSettings
from tests.helpers import (
    REPO,
    Processes,
    done_chunk_count,
    free_port,
    read_records,
    wait_until,
    write_prompts,
)

SIM = ("--time-scale", "0.001")
MODEL_A = "Model-A"  # matches the server of /dev/shm/models/Model-A by the path's last component
PATH_A = "/dev/shm/models/Model-A"
MODEL_B = "Org/Model-B"


def job_args(inp: Path, out: Path, model: str, *extra: str) -> list[str]:
    return ["--input", str(inp), "--output", str(out), "--model", model, "--chunk-size", "10", *extra]


def chat_requests(sim: str) -> int:
    return int(requests.get(f"{sim}/sim/stats", timeout=5).json()["requests_total"])


def start_enqueue(procs: Processes, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_tasks.enqueue", *args],
        cwd=REPO,
        env=procs.env,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
    )


def verified(procs: Processes, inp: Path, out: Path) -> dict[str, Any]:
    res = procs.run("dflash_tasks.verify", "--input", str(inp), "--output", str(out), "--json")
    report = dict(json.loads(res.stdout.strip().splitlines()[-1]))
    assert res.returncode == 0, report
    return report


def test_two_models_on_one_redis_each_job_reaches_only_its_own_servers(
    procs: Processes, tmp_path: Path
) -> None:
    sim_a = procs.simulator(*SIM, "--model", PATH_A, name="sim-a")
    sim_b = procs.simulator(*SIM, "--model", MODEL_B, "--served-model-name", "model-b", name="sim-b")
    procs.worker(sim_a, "gpu-a")
    procs.worker(sim_b, "gpu-b")
    inp_a, out_a, inp_b, out_b = (
        tmp_path / "a.jsonl",
        tmp_path / "out-a",
        tmp_path / "b.jsonl",
        tmp_path / "out-b",
    )
    write_prompts(inp_a, 300)
    write_prompts(inp_b, 200)
    # Both jobs at once, the first with its preflight: each fleet is busy with its own job only.
    job_a = start_enqueue(
        procs, tmp_path / "enqueue-a.log", *job_args(inp_a, out_a, MODEL_A, "--wait", "--json")
    )
    job_b = start_enqueue(
        procs,
        tmp_path / "enqueue-b.log",
        *job_args(inp_b, out_b, "model-b", "--wait", "--json", "--no-preflight"),
    )
    assert job_a.wait(180) == 0, (tmp_path / "enqueue-a.log").read_text()
    assert job_b.wait(180) == 0, (tmp_path / "enqueue-b.log").read_text()

    assert verified(procs, inp_a, out_a)["ok"] == 300
    assert verified(procs, inp_b, out_b)["ok"] == 200
    records_a, records_b = read_records(out_a), read_records(out_b)
    assert {(r["endpoint"], r["worker"].split("@")[0]) for r in records_a} == {(sim_a, "gpu-a")}
    assert {(r["endpoint"], r["worker"].split("@")[0]) for r in records_b} == {(sim_b, "gpu-b")}
    # Every request each server received was one of its own job's attempts: none crossed over.
    assert chat_requests(sim_a) == sum(r["attempts"] for r in records_a)
    assert chat_requests(sim_b) == sum(r["attempts"] for r in records_b)


def test_no_worker_for_the_model_is_said_and_stray_chunks_are_put_on_their_queue(
    procs: Processes, tmp_path: Path
) -> None:
    sim_a = procs.simulator(*SIM, "--model", PATH_A, name="sim-a")
    sim_b = procs.simulator(*SIM, "--model", MODEL_B, name="sim-b")
    procs.worker(sim_b, "gpu-b")
    r = redis.Redis.from_url(procs.broker_url)
    beat = wait_until(
        lambda: next(
            (r.hgetall(k) for k in r.scan_iter(f"t-{procs.queue}:worker:gpu-b@*") if r.hget(k, "model")), None
        ),
        30,
        "gpu-b's heartbeat",
    )
    assert beat[b"model"] == beat[b"model_path"] == MODEL_B.encode()
    assert beat[b"queues"].decode() == f"{procs.model_queue(MODEL_B)},{procs.queue}"

    inp, out = tmp_path / "a.jsonl", tmp_path / "out-a"
    write_prompts(inp, 100)
    log = tmp_path / "enqueue.log"
    waiting = start_enqueue(procs, log, *job_args(inp, out, MODEL_A, "--wait", "--json", "--no-preflight"))
    said = "no live worker serves model 'Model-A'; the live workers serve: Org/Model-B (1 worker)"
    wait_until(lambda: said in log.read_text(), 60, "enqueue --wait to say no worker serves Model-A")

    status = procs.run("dflash_tasks.status", "--output", str(out))
    assert status.returncode == 0, status.stderr
    assert f"! {said}; the job's chunks wait in queue {procs.model_queue(MODEL_A)}" in status.stdout

    # Hand-made strays: a chunk of the Model-A job on Model-B's queue, another on the base queue.
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    app = Celery("test-strays", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=procs.broker_url, queue=procs.queue))
    try:
        publish_chunks(app, job_id, [3], queue=procs.model_queue(MODEL_B))
        publish_chunks(app, job_id, [4], queue=procs.queue)
    finally:
        app.close()
    worker_log = tmp_path / "gpu-b.log"
    lines = [
        f"chunk {chunk} of job {job_id} (from queue {source}) put on queue {procs.model_queue(MODEL_A)}"
        for chunk, source in ((3, procs.model_queue(MODEL_B)), (4, procs.queue))
    ]
    wait_until(lambda: all(line in worker_log.read_text() for line in lines), 30, "both strays put back")
    assert "this worker's server serves 'Org/Model-B'" in worker_log.read_text()
    assert chat_requests(sim_b) == 0 and done_chunk_count(out) == 0
    assert r.llen(procs.model_queue(MODEL_B)) == 0 and r.llen(procs.queue) == 0
    assert r.llen(procs.model_queue(MODEL_A)) == 12  # the job's 10 chunks and the two strays
    assert queued_chunks(r, procs.model_queue(MODEL_A), job_id) == set(range(10))

    # A worker for Model-A arrives: the job runs there, and only there.
    procs.worker(sim_a, "gpu-a")
    assert waiting.wait(120) == 0, log.read_text()
    report = verified(procs, inp, out)
    assert report["ok"] == 100 and report["duplicated"] == 0
    assert {r["worker"].split("@")[0] for r in read_records(out)} == {"gpu-a"}
    assert chat_requests(sim_b) == 0


def test_a_model_name_with_a_colon_is_refused(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "a.jsonl", tmp_path / "out"
    write_prompts(inp, 10)
    res = procs.run("dflash_tasks.enqueue", *job_args(inp, out, "Qwen/Qwen3-8B:my-lora"))
    assert res.returncode == 2
    assert "error: --model 'Qwen/Qwen3-8B:my-lora' contains ':'" in res.stderr
    assert "LoRA adapter" in res.stderr
    assert not out.exists()
    r = redis.Redis.from_url(procs.broker_url)
    assert not list(r.scan_iter(f"{procs.queue}*")) and not list(r.scan_iter(f"t-{procs.queue}:*"))


def test_enqueue_without_wait_says_when_no_worker_serves_the_model(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "a.jsonl", tmp_path / "out"
    write_prompts(inp, 20)
    res = procs.run("dflash_tasks.enqueue", *job_args(inp, out, MODEL_A, "--no-preflight", "--json"))
    assert res.returncode == 0, res.stderr
    assert "warning: no live worker serves model 'Model-A': no worker is live" in res.stderr


def sim_on_port(procs: Processes, port: int, name: str, *flags: str) -> subprocess.Popen[bytes]:
    proc = procs.spawn(["-m", "dflash_tasks.sim", *flags, "--port", str(port)], f"{name}.log")
    wait_until(lambda: b"SIM READY" in (procs.tmp / f"{name}.log").read_bytes(), 20, f"simulator {name}")
    return proc


def test_a_server_restarted_with_another_model_mid_chunk_stores_nothing_and_moves_its_worker(
    procs: Processes, tmp_path: Path
) -> None:
    # Requests of 2.5 s (100 tokens at 40 tok/s), and a worker that keeps retrying through a restart.
    slow = ("--mean-output-tokens", "100", "--output-tokens-sigma", "0")
    port = free_port()
    sim_a = sim_on_port(procs, port, "sim-a", *slow, "--model", PATH_A)
    endpoint = f"http://127.0.0.1:{port}"
    procs.env.update(DFLASH_IDENTITY_SECONDS="1", DFLASH_REQUEST_ATTEMPTS="40")
    procs.env.update(DFLASH_RETRY_BACKOFF_MAX="0.3")
    procs.worker(endpoint, "gpu0")
    inp_a, out_a = tmp_path / "a.jsonl", tmp_path / "out-a"
    inp_b, out_b = tmp_path / "b.jsonl", tmp_path / "out-b"
    write_prompts(inp_a, 10)
    write_prompts(inp_b, 20)
    res = procs.run("dflash_tasks.enqueue", *job_args(inp_a, out_a, MODEL_A, "--no-preflight", "--json"))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
    r = redis.Redis.from_url(procs.broker_url)
    wait_until(lambda: r.hlen(f"t-{procs.queue}:job:{job_id}:owners") == 1, 30, "chunk 0 leased")

    # The server is replaced by one of another model while the chunk's requests are in flight.
    os.killpg(sim_a.pid, signal.SIGKILL)
    sim_a.wait(10)
    sim_on_port(procs, port, "sim-b", *slow, "--model", MODEL_B)
    log = tmp_path / "gpu0.log"
    queue_a = procs.model_queue(MODEL_A)
    moved = f"chunk 0 of job {job_id} (from queue {queue_a}) put on queue {queue_a}"
    wait_until(lambda: moved in log.read_text(), 60, "the finished chunk refused before storing")
    text = log.read_text()
    assert f"server now serves model 'Org/Model-B' (was '{PATH_A}')" in text
    assert f"stopped consuming queue {procs.model_queue(MODEL_A)}" in text
    assert f"consuming queue {procs.model_queue(MODEL_B)}" in text
    assert done_chunk_count(out_a) == 0 and chat_requests(endpoint) > 0  # generated by B, never stored
    assert queued_chunks(r, procs.model_queue(MODEL_A), job_id) == {0}

    # The worker now serves Model-B's jobs, and Model-A's job waits, said so.
    res = procs.run("dflash_tasks.enqueue", *job_args(inp_b, out_b, MODEL_B, "--no-preflight", "--wait"))
    assert res.returncode == 0, res.stderr
    assert verified(procs, inp_b, out_b)["ok"] == 20
    status = procs.run("dflash_tasks.status", "--output", str(out_a))
    said = "no live worker serves model 'Model-A'; the live workers serve: Org/Model-B (1 worker)"
    assert said in status.stdout
    assert done_chunk_count(out_a) == 0
