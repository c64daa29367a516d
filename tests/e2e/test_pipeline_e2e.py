"""End-to-end jobs with real processes: Redis, Celery workers, simulators over HTTP.

Besides the stored records, each job counts generation in the simulators (``GET /sim/requests``):
a sample generated twice is wasted GPU time even when only one record of it is stored.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import redis
import requests

from tests.helpers import (
    Generation,
    Processes,
    done_chunk_count,
    generation,
    read_records,
    recovered_by,
    sent_bodies,
    wait_until,
    write_prompts,
)

MODEL = "Qwen/Qwen3-8B"


def enqueue_args(inp: Path, out: Path, *extra: str) -> list[str]:
    return ["--input", str(inp), "--output", str(out), "--model", MODEL, *extra]


def last_json(stdout: str) -> dict[str, object]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def verify_ok(procs: Processes, inp: Path, out: Path) -> dict[str, object]:
    res = procs.run("dflash_tasks.output.verify", "--input", str(inp), "--output", str(out), "--json")
    report = last_json(res.stdout)
    assert res.returncode == 0, report
    return report


def test_multi_worker_job_with_bad_lines_then_rerun_enqueues_nothing(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    bad = write_prompts(inp, 1100, bad_every=37)
    sims = [procs.simulator("--time-scale", "0.001", name=f"sim{i}") for i in range(2)]
    for i, name in enumerate(["gpu0", "gpu1", "gpu2"]):
        procs.worker(sims[i % 2], name)
    res = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--chunk-size", "32", "--wait", "--json")
    )
    assert res.returncode == 0, res.stderr
    summary = last_json(res.stdout)
    assert summary["samples"] == 1100 - bad and summary["invalid"] == bad
    assert summary["chunks"] == -(-(1100 - bad) // 32) and summary["chunks_done"] == summary["chunks"]
    assert "invalid lines" in res.stderr and "prompts.jsonl:37: malformed JSON" in res.stderr

    report = verify_ok(procs, inp, out)
    assert report["ok"] == 1100 - bad and report["failed"] == 0 and report["invalid"] == bad
    records = read_records(out)
    assert len({r["id"] for r in records}) == len(records) == 1100 - bad
    assert {r["worker"].split("@")[0] for r in records} == {"gpu0", "gpu1", "gpu2"}
    first = next(r for r in records if r["finish_reason"] == "stop")
    (turn,) = first["turns"]
    assert turn["reasoning"] and turn["content"] and first["status"] == turn["status"] == "ok"
    assert turn["reasoning"] == turn["reasoning"].strip() and turn["content"] == turn["content"].strip()
    assert first["usage"]["completion_tokens"] > 0 and first["sampling"]["enable_thinking"] is True
    shared = next(r for r in records if r["id"] == "1")  # ShareGPT with an old assistant turn
    assert [t["input"] for t in shared["turns"]] == [
        [{"role": "user", "content": "Question 1: what is 1 * 7?"}]
    ]
    gen = generation(inp, sims)
    assert (gen.generated, gen.wasted, gen.ungenerated) == (1100 - bad, 0, 0), gen
    # What the workers really sent, not the job spec's copy of it.
    bodies = [b for sim in sims for b in sent_bodies(sim)]
    assert len(bodies) == 1100 - bad and len({b["rid"] for b in bodies}) == len(bodies)
    sent = {json.dumps({k: b.get(k) for k in SAMPLING_SENT}, sort_keys=True) for b in bodies}
    assert [json.loads(s) for s in sent] == [
        {
            "chat_template_kwargs": {"enable_thinking": True},
            "max_tokens": 4096,
            "model": MODEL,
            "separate_reasoning": True,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
        }
    ]

    again = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--chunk-size", "32", "--json")
    )
    assert again.returncode == 0, again.stderr
    assert last_json(again.stdout)["chunks_enqueued"] == 0

    changed = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--chunk-size", "32", "--temperature", "1.0")
    )
    assert (
        changed.returncode == 2 and "temperature: the output has 0.6, this run asks for 1.0" in changed.stderr
    )


SAMPLING_SENT = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "chat_template_kwargs",
    "separate_reasoning",
)


def test_worker_sigkill_mid_chunk_loses_nothing(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 200)
    sim = procs.simulator("--time-scale", "0.02", "--mean-output-tokens", "1500")
    victim = procs.worker(sim, "victim")
    procs.worker(sim, "survivor")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "20", "--json", "--no-preflight"),
    )
    assert res.returncode == 0, res.stderr
    job_id = str(last_json(res.stdout)["job_id"])
    owners_key = f"t-{procs.queue}:job:{job_id}:owners"
    r = redis.Redis.from_url(procs.broker_url)
    held = wait_until(
        lambda: [int(c) for c, o in r.hgetall(owners_key).items() if o.startswith(b"victim@")],
        30,
        "victim lease",
    )
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    lost = {c for c in held if not (out / "outputs" / f"chunk-{c:06d}.jsonl").exists()}
    wait_until(lambda: done_chunk_count(out) == 10, 120, "all 10 chunks done")
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 200 and report["duplicated"] == 0
    by = recovered_by(tmp_path, job_id)  # the survivor's own account of how they came back
    assert all("lease_expired" in by.get(c, set()) for c in lost), (sorted(lost), by)
    gen = generation(inp, [sim])
    assert gen.ungenerated == 0 and gen.wasted <= 20 * len(held), gen  # only the victim's part
    by_chunk = {
        json.loads((out / "outputs" / f"chunk-{c:06d}.jsonl").read_text().splitlines()[0])["worker"]
        for c in held
    }
    assert all(w.startswith("survivor@") for w in by_chunk), by_chunk


def test_redis_flushall_mid_run_then_rerun_recovers(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 600)
    sim = procs.simulator("--time-scale", "0.01", "--mean-output-tokens", "1000")
    procs.worker(sim, "gpu0")
    args = enqueue_args(inp, out, "--chunk-size", "20", "--json", "--no-preflight")
    first = procs.run("dflash_tasks.producer.enqueue", *args)
    assert first.returncode == 0, first.stderr
    wait_until(lambda: done_chunk_count(out) >= 3, 60, "first chunks")
    r = redis.Redis.from_url(procs.broker_url)
    running = r.hlen(f"t-{procs.queue}:job:{last_json(first.stdout)['job_id']}:owners")
    r.flushall()
    before = done_chunk_count(out)
    assert before < 30
    rerun = procs.run("dflash_tasks.producer.enqueue", *args, "--wait")
    assert rerun.returncode == 0, rerun.stderr
    summary = last_json(rerun.stdout)
    assert summary["chunks_done"] == 30 and summary["job_id"]
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 600 and report["duplicated"] == 0, report
    # A chunk queued twice runs once, except one the re-run queued again before the worker's
    # heartbeat re-created its lease: at most the chunks running at the flush.
    gen = generation(inp, [sim])
    assert gen.ungenerated == 0 and gen.wasted <= 20 * running, (gen, running)


def test_server_errors_for_a_while_are_retried(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 200)
    sim = procs.simulator("--time-scale", "0.001")
    procs.worker(sim, "gpu0")
    requests.post(f"{sim}/sim/faults", json={"kind": "http_500", "count": 60}, timeout=5).raise_for_status()
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "25", "--wait", "--json", "--no-preflight"),
    )
    assert res.returncode == 0, res.stderr
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 200 and report["failed"] == 0
    attempts = Counter(r["attempts"] for r in read_records(out))
    assert sum(n for a, n in attempts.items() if a > 1) > 0  # the 500s really happened and were retried
    assert generation(inp, [sim]) == Generation(200, 0, 0, 0)  # refused before generating: nothing wasted


def test_too_long_prompt_fails_only_its_own_sample_and_thinking_off_is_sent(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 100, long_at=8)
    sim = procs.simulator("--time-scale", "0.001", "--context-length", "8192")
    procs.worker(sim, "gpu0")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(
            inp,
            out,
            *("--max-tokens", "2048", "--no-thinking", "--min-completion-tokens", "1"),
            *("--wait", "--json", "--no-preflight"),
        ),
    )
    assert res.returncode == 0, res.stderr
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 99 and report["failed"] == 1
    failed = [r for r in read_records(out) if r["status"] == "failed"]
    assert [r["id"] for r in failed] == ["q8"]
    assert "longer than the model's context length" in failed[0]["error"] and failed[0]["attempts"] == 1
    assert generation(inp, [sim]) == Generation(99, 0, 1, 0)  # the rejected prompt was never generated
    bodies = sent_bodies(sim)  # the rejected request never reached the log: it failed validation
    assert len(bodies) == 99 and {json.dumps(b["chat_template_kwargs"]) for b in bodies} == {
        '{"enable_thinking": false}'
    }
    ok = [r for r in read_records(out) if r["status"] == "ok"]
    turns = [t for r in ok for t in r["turns"]]
    assert all(t["content"] and not t["reasoning"] for t in turns)
    assert not any(r["usage"]["reasoning_tokens"] for r in ok)


def test_dead_server_pauses_its_worker_and_chunks_move_on(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 300)
    healthy = procs.simulator("--time-scale", "0.005", "--mean-output-tokens", "800", name="healthy")
    doomed = procs.simulator("--time-scale", "0.005", "--mean-output-tokens", "800", name="doomed")
    procs.worker(healthy, "gpu0")
    procs.worker(doomed, "gpu1")
    requests.post(f"{doomed}/sim/faults", json={"kind": "reset", "seconds": 3600}, timeout=5)
    requests.post(f"{doomed}/sim/faults", json={"kind": "unhealthy", "seconds": 3600}, timeout=5)
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "15", "--wait", "--json", "--no-preflight"),
    )
    assert res.returncode == 0, res.stderr
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 300 and report["failed"] == 0
    assert {r["worker"].split("@")[0] for r in read_records(out)} == {"gpu0"}
    log = (tmp_path / "gpu1.log").read_text()
    assert "pausing this worker's consumption" in log
    assert generation(inp, [healthy, doomed]) == Generation(300, 0, 0, 0)  # resets cost no generation


def test_job_against_a_loading_server_with_an_api_key(procs: Processes, tmp_path: Path) -> None:
    """The worker starts while its server still loads; the server wants a key; records say who served."""
    key = f"sk-e2e-{uuid.uuid4().hex}"
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 120)
    sim_flags = ["--port", "0", "--time-scale", "0.001", "--load-seconds", "4", "--startup-seconds", "2"]
    sim_flags += ["--api-key", key, "--model-path", "/models/Qwen3-8B", "--served-model-name", "qwen3-8b"]
    procs.spawn(["-m", "dflash_tasks.sim", *sim_flags], "sim.log")

    def loading() -> str | None:
        for line in (tmp_path / "sim.log").read_text(errors="replace").splitlines():
            if line.startswith("SIM LOADING "):
                return line.split(" ", 2)[2].strip()
        return None

    sim = str(wait_until(loading, 20, "the simulator to bind its port"))
    procs.env["DFLASH_SGLANG_API_KEY"] = key  # the workers' setting; never on a command line
    procs.worker(sim, "gpu0")
    del procs.env["DFLASH_SGLANG_API_KEY"]
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "20", "--wait", "--json", "--no-preflight"),
    )
    assert res.returncode == 0, res.stderr
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 120 and report["failed"] == 0
    records = read_records(out)
    assert all(
        r["server"]
        == {"model_path": "/models/Qwen3-8B", "served_model_name": "qwen3-8b", "version": "0.5.23"}
        for r in records
    )
    turns = [t for r in records for t in r["turns"]]
    assert all(t["meta_info"]["spec_verify_ct"] > 0 for t in turns)
    assert all(t["meta_info"]["spec_accept_length"] >= 1 for t in turns)
    log = (tmp_path / "gpu0.log").read_text()
    assert "cannot read the server's model" in log  # asked at start, while the port refused
    assert "server serves model 'qwen3-8b' (/models/Qwen3-8B) (SGLang 0.5.23)" in log
    stored = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
    assert stored and not any(key.encode() in data for data in stored)
    assert key not in log and key not in res.stdout + res.stderr
