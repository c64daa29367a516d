"""Quality gates end to end: the seed's failure (no thinking) is caught before and during a run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import redis

from dflash_tasks.core.quality import QualitySettings
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json, verify_ok
from tests.helpers import Processes, done_chunk_count, read_records, wait_until, write_prompts


def job_state(procs: Processes, job_id: str) -> dict[bytes, bytes]:
    r = redis.Redis.from_url(procs.broker_url)
    return dict(r.hgetall(f"t-{procs.queue}:job:{job_id}"))  # type: ignore[arg-type]


def test_healthy_job_passes_preflight_and_counts_its_samples(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 640)
    sim = procs.simulator("--time-scale", "0.001")
    procs.worker(sim, "gpu0")
    res = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--preflight", "200", "--wait", "--json")
    )
    assert res.returncode == 0, res.stderr
    assert "preflight: 4 chunks spread over the input" in res.stderr and "preflight passed" in res.stderr
    report = json.loads((out / "preflight.json").read_text())
    assert report["passed"] and report["samples"] == 256 and report["checks"].get("no_reasoning", 0) == 0
    assert report["output_tokens"]["p50"] > 500
    assert sorted(int(p.stem.split("-")[1]) for p in (out / "outputs").glob("*.jsonl"))[:1] == [0]
    verify_ok(procs, inp, out)
    records = read_records(out)
    assert all("checks" in r for r in records)
    assert not any("no_reasoning" in r["checks"] for r in records)


def test_no_thinking_server_fails_preflight_then_fixed_server_completes(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 1000)
    bad_sim = procs.simulator("--time-scale", "0.001", "--ignore-thinking-flag", name="badsim")
    bad = procs.worker(bad_sim, "misconfigured")
    res = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--wait", "--json"))
    assert res.returncode == 3, res.stderr
    assert "100% of samples have no reasoning" in res.stderr
    assert "is enable_thinking on and the server started with a reasoning parser" in res.stderr
    assert done_chunk_count(out) == 0  # the bad preflight outputs are not kept
    assert not (out / "preflight.json").exists()
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    assert job_state(procs, job_id)[b"state"] == b"paused"
    assert (
        redis.Redis.from_url(procs.broker_url).llen(procs.model_queue()) == 0
    )  # the full job was never queued

    os.killpg(bad.pid, signal.SIGKILL)
    procs.worker(procs.simulator("--time-scale", "0.001", name="goodsim"), "fixed")
    rerun = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--wait", "--json"))
    assert rerun.returncode == 0, rerun.stderr
    assert last_json(rerun.stdout)["chunks_done"] == 16
    verify_ok(procs, inp, out)
    assert {r["worker"].split("@")[0] for r in read_records(out)} == {"fixed"}


def test_live_gate_pauses_a_going_bad_run_and_resume_finishes_it(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 2000)
    bad_sim = procs.simulator("--time-scale", "0.001", "--ignore-thinking-flag", name="badsim")
    bad = procs.worker(bad_sim, "misconfigured")
    args = enqueue_args(inp, out, "--chunk-size", "20", "--no-preflight", "--wait", "--json")
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 1, res.stderr
    assert "job paused: quality gate over the last" in res.stderr and "have no reasoning" in res.stderr
    assert "python -m dflash_tasks.resume --output" in res.stderr
    paused_at = done_chunk_count(out)
    assert 5 <= paused_at < 100  # stopped early: ~min_samples, plus the chunks that were in flight
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    assert b"have no reasoning" in job_state(procs, job_id)[b"pause_reason"]
    log = (tmp_path / "misconfigured.log").read_text()
    assert "paused: quality gate" in log

    os.killpg(bad.pid, signal.SIGKILL)
    procs.worker(procs.simulator("--time-scale", "0.001", name="goodsim"), "fixed")
    resumed = procs.run("dflash_tasks.producer.resume", "--output", str(out), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert last_json(resumed.stdout)["was_paused"] is True
    watch = procs.run("dflash_tasks.producer.enqueue", *args)
    assert watch.returncode == 0, watch.stderr
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 2000 and report["duplicated"] == 0
    records = read_records(out)
    bad_records = [r for r in records if "no_reasoning" in r["checks"]]
    assert 100 <= len(bad_records) < 2000
    assert all(r["worker"].startswith("misconfigured@") for r in bad_records)


def test_live_gate_judges_the_recent_window_not_the_whole_job(procs: Processes, tmp_path: Path) -> None:
    """A run good for its first thousand samples, then bad: the gate trips on the last few hundred
    samples although the whole job's bad share is still far below the threshold."""
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 4000)
    procs.worker(procs.simulator("--time-scale", "0.001", name="goodsim"), "good")
    args = enqueue_args(inp, out, "--chunk-size", "20", "--no-preflight", "--json")
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 0, res.stderr
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    wait_until(lambda: done_chunk_count(out) >= 50, 120, "a thousand good samples")
    bad_sim = procs.simulator("--time-scale", "0.001", "--ignore-thinking-flag", name="badsim")
    procs.worker(bad_sim, "misconfigured", "--max-inflight", "20")
    wait_until(lambda: job_state(procs, job_id).get(b"state") == b"paused", 120, "the live gate's pause")
    records = read_records(out)  # what was stored when the gate tripped
    bad = [r for r in records if "no_reasoning" in r["checks"]]
    assert bad and all(r["worker"].startswith("misconfigured@") for r in bad)
    assert len(bad) / len(records) < QualitySettings().max_share["no_reasoning"]  # the job as a whole is fine
    reason = job_state(procs, job_id)[b"pause_reason"].decode()
    window = int(reason.split("quality gate over the last ")[1].split(" samples")[0])
    assert QualitySettings().window <= window < len(records)
    assert "have no reasoning" in reason
