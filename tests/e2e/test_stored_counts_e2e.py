"""The worker counts each record's loss tokens beside its server; export and report add them up.

Real simulator, real worker process, real enqueue, report and export.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.e2e.test_multiturn_e2e import write_conversations
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json
from tests.e2e.test_trainable_e2e import served_model
from tests.helpers import Processes


def _strip_counts(out: Path) -> int:
    """Remove the stored counts from every record of a copied output (what an older worker wrote)."""
    stripped = 0
    for path in sorted((out / "outputs").glob("*.jsonl")):
        lines = []
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            stripped += doc.pop("loss_counts", None) is not None
            lines.append(json.dumps(doc, ensure_ascii=False))
        path.chmod(0o644)
        path.write_text("\n".join(lines) + "\n")
    return stripped


def _export(procs: Processes, out: Path, to: Path, *flags: str) -> dict[str, Any]:
    res = procs.run("dflash_tasks.export", "--output", str(out), "--to", str(to), *flags)
    assert res.returncode == 0, res.stderr
    manifest: dict[str, Any] = json.loads(Path(f"{to}.manifest.json").read_text())
    return manifest


def test_stored_counts_equal_the_recount_and_need_no_tokenizer(procs: Processes, tmp_path: Path) -> None:
    inp, out = tmp_path / "convos.jsonl", tmp_path / "out"
    write_conversations(inp, 24)
    model_dir = served_model(procs, tmp_path, "--mean-output-tokens", "600")
    args = enqueue_args(inp, out, "--chunk-size", "8", "--no-preflight", "--wait", "--json")
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 0, res.stderr

    records = [
        json.loads(x) for p in sorted((out / "outputs").glob("*.jsonl")) for x in p.read_text().splitlines()
    ]
    assert len(records) == 24
    counts = [r["loss_counts"] for r in records]
    assert all(f"tokenizer={model_dir};" in c["view"] and "max_length=4096" in c["view"] for c in counts)
    assert all(
        len(c["per_turn"]) == sum(t["status"] == "ok" for t in r["turns"])
        for r, c in zip(records, counts, strict=True)
    )
    assert sum(c["conversation"][0][1] for c in counts if c["conversation"]) > 0

    recount = tmp_path / "recount"
    shutil.copytree(out, recount)
    assert _strip_counts(recount) == 24
    stored = procs.run("dflash_tasks.report", "--output", str(out), "--json")
    again = procs.run("dflash_tasks.report", "--output", str(recount), "--json")
    assert stored.returncode == 0 and again.returncode == 0, stored.stderr + again.stderr
    a, b = last_json(stored.stdout), last_json(again.stdout)
    counted: dict[str, Any] = dict(a["yield"])  # type: ignore[call-overload]
    assert a["yield"] == b["yield"] and counted["trainable_tokens"] > 0
    assert a["trainable"] == b["trainable"]
    for layout in ("conversation", "per-turn"):
        flags = ("--layout", layout)
        manifest = _export(procs, out, tmp_path / f"stored-{layout}.jsonl", *flags)
        recounted = _export(procs, recount, tmp_path / f"recount-{layout}.jsonl", *flags)
        assert manifest["layout"] == layout and manifest["trainable_tokens"] > 0
        assert manifest["yield"] == recounted["yield"] and manifest["trainable"] == recounted["trainable"]
        written = (tmp_path / f"stored-{layout}.jsonl").read_bytes()
        assert written == (tmp_path / f"recount-{layout}.jsonl").read_bytes()

    # The tokenizer gone from this machine: the stored counts still count, the stripped ones cannot.
    shutil.rmtree(model_dir)
    alone = _export(procs, out, tmp_path / "alone.jsonl", "--layout", "per-turn")
    assert alone["yield"] == manifest["yield"]
    assert "counted by the workers" in alone["trainer"]["note"]
    blind = _export(procs, recount, tmp_path / "blind.jsonl", "--layout", "per-turn")
    assert blind["trainable_tokens"] is None
