"""The live yield after a job with repair rounds equals what ``report`` and ``export`` state.

Real simulator serving a tiny tokenizer's directory (``/model_info`` names it, so the worker counts
loss tokens beside it), a real worker process, ``enqueue --wait`` twice: a first pass at
``--max-tokens 300`` whose cut thoughts the repair rounds continue to the trainer's horizon, then
``--repair-truncated --max-tokens 4000``, which regenerates the turns cut in their answer (their
first attempt is paid for and superseded). Then ``status --json`` (the counters the workers moved
once per chunk and round), ``progress.json``, ``report --json`` and the export manifest (recounted
from the stored records) must state the same yield.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.test_multiturn_e2e import write_conversations
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.e2e.test_trainable_e2e import served_model
from tests.helpers import Processes

LIVE_ONLY = ("counted_chunks", "usd_per_million_trainable")  # the live section's own figures


def _enqueue(procs: Processes, inp: Path, out: Path, *flags: str) -> dict[str, Any]:
    args = enqueue_args(inp, out, "--chunk-size", "8", "--no-preflight", "--wait", "--json", *flags)
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 0, res.stderr
    return dict(last_json(res.stdout))


def test_the_live_yield_after_continued_and_regenerated_turns_equals_reports(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out = tmp_path / "convos.jsonl", tmp_path / "out"
    write_conversations(inp, 30, failing=4)  # sample c4's second turn is refused: a failed record
    served_model(procs, tmp_path, "--mean-output-tokens", "400")
    first = _enqueue(procs, inp, out, "--max-tokens", "300", "--max-share", "truncated=1.0")
    again = _enqueue(procs, inp, out, "--max-tokens", "4000", "--repair-truncated", "--gpu-hour-usd", "3")
    assert again["job_id"] == first["job_id"]
    records = [json.loads(x) for p in sorted((out / "outputs").glob("*.repair-*.jsonl")) for x in p.open()]
    assert any(t.get("parts") for r in records for t in r["turns"])  # continued thoughts
    assert any(r["sampling"]["max_tokens"] == 4000 for r in records)  # the amendment's regenerations

    status = procs.run("dflash_tasks.status", "--output", str(out), "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    live = doc["yield"]
    assert live is not None and live["counted_chunks"] == doc["chunks"]["total"]
    # every token the servers generated: the first passes, the continuations, the regenerated turns
    assert live["generated_tokens"] == doc["tokens"]["generated"]
    assert live["where_the_rest_went"]["superseded"] > 0  # turns cut in their answer, generated again
    assert live["usd_per_million_trainable"] is None or live["usd_per_million_trainable"] > 0

    res = procs.run("dflash_tasks.report", "--output", str(out), "--json", "--png", str(tmp_path / "r.png"))
    assert res.returncode in (0, 1), res.stderr  # 1: a gate failed (the refused sample)
    reported = dict(last_json(res.stdout)["yield"])  # type: ignore[call-overload]
    assert {k: v for k, v in live.items() if k not in LIVE_ONLY} == reported
    assert reported["trainable_tokens"] > 0 and reported["yield"] > 0.5

    exported = procs.run("dflash_tasks.export", "--output", str(out), "--to", str(tmp_path / "t.jsonl"))
    assert exported.returncode == 0, exported.stderr
    manifest = json.loads((tmp_path / "t.jsonl.manifest.json").read_text())
    assert manifest["yield"] == reported

    progress = json.loads((out / "progress.json").read_text())  # written by --wait after the rounds
    assert {k: v for k, v in progress["yield"].items() if k not in LIVE_ONLY} == reported
    assert "yield     " in procs.run("dflash_tasks.status", "--output", str(out)).stdout
