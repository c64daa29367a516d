"""The preflight judges what the trainer will learn from, and stops a job whose rows teach nothing.

Each gate is tested where it is used: real simulator, real worker, real enqueue.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from dflash_tasks.sim.requestlog import read_requests
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from tests.e2e.test_multiturn_e2e import write_conversations
from tests.e2e.test_pipeline_e2e import MODEL, enqueue_args, last_json, verify_ok
from tests.helpers import Processes, done_chunk_count, write_prompts


def served_model(procs: Processes, tmp_path: Path, *flags: str) -> str:
    """A simulator whose /model_info names a readable model directory (a tiny Qwen3 tokenizer)."""
    model_dir = build_model_dir(tmp_path / "models", QWEN3_TEMPLATE, "Qwen3-8B")
    sim = procs.simulator(
        "--time-scale", "0.001", "--model-path", str(model_dir), "--served-model-name", MODEL, *flags
    )
    procs.worker(sim, "gpu0")
    return str(model_dir)


def assert_stopped_before_the_full_job(procs: Processes, out: Path) -> None:
    assert done_chunk_count(out) == 0  # the preflight's outputs are deleted
    assert not (out / "preflight.json").exists()
    assert redis.Redis.from_url(procs.broker_url).llen(procs.model_queue()) == 0  # nothing else queued


def test_rows_with_a_handful_of_loss_tokens_stop_the_preflight(procs: Processes, tmp_path: Path) -> None:
    """The seed's failure: short answers without thinking, a few loss tokens per row."""
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 640)
    model_dir = served_model(procs, tmp_path)
    res = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--no-thinking", "--json"))
    assert res.returncode == 3, res.stderr
    assert (
        f"with the tokenizer and chat template at {model_dir} (the served model's path, from /model_info)"
        in res.stderr
    )
    assert "100% of samples have fewer than the minimum loss tokens under the chat template" in res.stderr
    assert "the trainer would learn from almost nothing" in res.stderr
    assert_stopped_before_the_full_job(procs, out)
    job = json.loads((out / "job.json").read_text())
    assert job["quality"]["max_share"]["few_loss_tokens"] == 0.10 and job["quality"]["min_loss_tokens"] == 64
    assert job["trainer"] == {"tokenizer": None, "max_length": 4096, "last_turn_only": False}


def test_rows_the_trainer_cuts_stop_the_preflight_and_a_longer_max_length_runs(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 320)
    model_dir = served_model(procs, tmp_path)
    args = enqueue_args(inp, out, "--tokenizer", model_dir, "--json")
    res = procs.run("dflash_tasks.producer.enqueue", *args, "--train-max-length", "512")
    assert res.returncode == 3, res.stderr
    assert "of samples lose loss tokens to the trainer's max_length" in res.stderr
    assert "set --train-max-length to the trainer's real max_length, or lower --max-tokens" in res.stderr
    assert "(--tokenizer)" in res.stderr
    assert_stopped_before_the_full_job(procs, out)
    assert json.loads((out / "job.json").read_text())["trainer"]["max_length"] == 512

    rerun = procs.run("dflash_tasks.producer.enqueue", *args, "--train-max-length", "65536", "--wait")
    assert rerun.returncode == 0, rerun.stderr
    assert "preflight passed" in rerun.stderr and last_json(rerun.stdout)["chunks_done"] == 5
    trainable = json.loads((out / "preflight.json").read_text())["trainable"]
    assert trainable["max_length"] == 65536 and trainable["truncated_by_trainer"] == 0
    assert trainable["total_loss_tokens"] > 256 * 500  # thoughts of ~1,700 words each
    verify_ok(procs, inp, out)
    status = procs.run("dflash_tasks.status", "--output", str(out), "--json")
    shown = last_json(status.stdout)["trainable_tokens"]
    assert shown["source"] == "preflight" and shown["counted_samples"] == trainable["samples"]
    assert shown["projected_total_loss_tokens"] > shown["total_loss_tokens"]  # 256 of 320 samples counted

    # The job recorded max_length 512 (its first run): report and export take the flag too.
    longer = ("--train-max-length", "65536")
    report = procs.run("dflash_tasks.report", "--output", str(out), "--json", *longer)
    assert report.returncode == 0, report.stderr
    counted = last_json(report.stdout)["trainable"]
    # the rows the default export writes (rows cut at max_tokens short of the horizon are not)
    assert 0 < counted["samples"] <= 320 and counted["total_loss_tokens"] > trainable["total_loss_tokens"]
    assert "(--tokenizer)" in last_json(report.stdout)["trainer_note"]
    status = procs.run("dflash_tasks.status", "--output", str(out))
    assert (
        f"trainable {counted['total_loss_tokens']:,} loss tokens over {counted['samples']:,} samples "
        "(by report)" in status.stdout
    )

    to = tmp_path / "train.jsonl"
    exported = procs.run("dflash_tasks.export", "--output", str(out), "--to", str(to), *longer)
    assert exported.returncode == 0, exported.stderr
    manifest = json.loads((tmp_path / "train.jsonl.manifest.json").read_text())
    assert manifest["trainable"]["samples"] == manifest["success"]  # the rows written, no more
    assert manifest["trainable_tokens"] == counted["total_loss_tokens"]  # report and export agree
    assert manifest["yield"] == last_json(report.stdout)["yield"]
    assert manifest["trainer"]["max_length"] == 65536
    assert f"trainable: {manifest['trainable_tokens']:,} loss tokens in {manifest['success']:,} rows" in (
        exported.stderr
    )


def test_mostly_truncated_outputs_stop_the_preflight(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 640)
    served_model(procs, tmp_path)
    res = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--max-tokens", "600", "--json"))
    assert res.returncode == 3, res.stderr
    assert "of samples are truncated: outputs hit max_tokens" in res.stderr
    assert_stopped_before_the_full_job(procs, out)


def test_history_reasoning_keep_sends_counts_and_exports_the_earlier_reasoning(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out, log = tmp_path / "convos.jsonl", tmp_path / "out", tmp_path / "requests.jsonl"
    write_conversations(inp, 24)
    model_dir = served_model(procs, tmp_path, "--mean-output-tokens", "600", "--record-requests", str(log))
    args = enqueue_args(
        inp, out, "--history-reasoning", "keep", "--chunk-size", "8", "--no-preflight", "--wait", "--json"
    )
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 0, res.stderr
    later = [b for b in read_requests(log) if "-T1-" not in str(b.get("rid"))]
    assert later and all(b["chat_template_kwargs"]["preserve_thinking"] is True for b in later)
    history = [m for b in later for m in b["messages"] if m["role"] == "assistant"]
    assert history and all(m.get("reasoning_content", "").strip() for m in history)

    keep = procs.run("dflash_tasks.report", "--output", str(out), "--json", "--tokenizer", model_dir)
    kept = last_json(keep.stdout)
    assert "earlier turns' reasoning kept (preserve_thinking)" in kept["trainer_note"]
    assert kept["trainable"]["reasoning_turns"] > kept["trainable"]["samples"]  # multi-turn rows
    assert kept["trainable"]["reasoning_dropped_by_template"] == 0
    exported = procs.run(
        "dflash_tasks.export",
        "--output",
        str(out),
        "--to",
        str(tmp_path / "t.jsonl"),
        "--tokenizer",
        model_dir,
    )
    assert exported.returncode == 0, exported.stderr
    manifest = json.loads((tmp_path / "t.jsonl.manifest.json").read_text())
    assert manifest["spec"]["spec"]["history_reasoning"] == "keep"
    assert manifest["trainable"]["reasoning_dropped_by_template"] == 0
