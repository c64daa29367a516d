"""Per input source figures: report (text and JSON, with loss tokens), progress.json's section."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_tasks.core.job import (
    JOB_KEY,
    MANIFEST_KEY,
    GenerationSpec,
    JobDefinition,
    Manifest,
    output_key,
    repair_key,
)
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.record import Record, encode_records
from dflash_tasks.core.repair import Superseded
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.source_quality import SOURCES_KEY
from dflash_tasks.core.source_quality import progress_sources as _sources
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.output.export import export
from dflash_tasks.output.report import build_report, render_text
from dflash_tasks.output.report import main as report_main
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore

JOB = JobDefinition.create("mix:sha256:x", "chat, code", GenerationSpec(model="m"), QualitySettings())


def record(i: int, source: str, *, finish: str = "stop", ok: bool = True, tokens: int = 300) -> Record:
    doc: dict[str, Any] = {
        "id": f"{source}:L{i}",
        "line": i,
        "source": source,
        "messages": [{"role": "user", "content": "alpha"}],
        "reasoning": "beta gamma",
        "content": "gamma delta",
        "finish_reason": finish,
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "reasoning_tokens": 250},
        "status": "ok" if ok else "failed",
        "checks": ["truncated"] if finish == "length" else [],
    }
    if not ok:
        doc |= {"error": "HTTP 400", "failure": "permanent"}
    return Record.from_dict(doc)


def records() -> list[Record]:
    chat = [record(i, "chat") for i in range(10)]
    code = [record(i, "code", finish="length", tokens=900) for i in range(4)]
    code += [record(4, "code", ok=False, tokens=0)] + [record(i, "code") for i in range(5, 10)]
    return chat + code


def test_report_shows_each_sources_figures_and_names_the_one_failing_a_gate() -> None:
    report = build_report(JOB, records(), 1, 1)
    doc = report.as_dict()["sources"]
    assert doc["chat"] | {"checks": {}} == {
        "samples": 10, "ok": 10, "failed": 0, "failures": {}, "truncated": 0, "truncated_share": 0.0,
        "checks": {}, "looping": 0, "looping_share": 0.0, "loop_tokens_saved": 0, "output_tokens": 3000,
        "loss_tokens": None, "few_loss_tokens": None, "cost_share": round(3000 / 8100, 4),
    }  # fmt: skip
    assert (doc["code"]["failed"], doc["code"]["failures"], doc["code"]["truncated"]) == (
        1,
        {"permanent": 1},
        4,
    )
    assert doc["code"]["output_tokens"] == 5100 and doc["code"]["truncated_share"] == 0.4
    text = render_text(report)
    assert "  chat: 10 samples, 10 ok, 0 failed (none), truncated 0 (0.0%)" in text
    assert "  code: 10 samples, 9 ok, 1 failed (permanent 1), truncated 4 (40.0%)" in text
    # The job as a whole passes its gates (20% truncated); one source alone does not.
    assert "source code fails a gate: 40% of samples are truncated" in text and "source chat" not in text
    assert text.endswith("gates passed")


def test_a_job_of_one_source_has_no_source_section() -> None:
    plain = [Record.from_dict({**record(i, "x").to_dict(), "source": None}) for i in range(3)]
    report = build_report(JOB, plain, 1, 1)
    assert report.as_dict()["sources"] is None and "per source" not in render_text(report)


def test_loss_tokens_are_counted_per_source(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = str(build_model_dir(tmp_path_factory.mktemp("m"), QWEN3_TEMPLATE))
    report = build_report(JOB, records(), 1, 1, TrainerView(tokenizer=model))
    assert report.trainable is not None
    doc = report.as_dict()["sources"]
    assert doc["chat"]["loss_tokens"] + doc["code"]["loss_tokens"] == report.trainable.total
    assert doc["chat"]["loss_tokens"] > 0 and doc["code"]["loss_tokens"] > 0


def test_progress_shows_the_staged_counts_and_the_reports_figures_with_their_cost() -> None:
    staged = [{"name": "chat", "samples": 10, "invalid": 1}, {"name": "code", "samples": 10, "invalid": 0}]
    quality = build_report(JOB, records(), 1, 1).sources.to_dict()
    doc = _sources(staged, quality, 81.0)
    assert doc is not None
    assert (doc["chat"]["staged_samples"], doc["chat"]["invalid"], doc["chat"]["usd"]) == (10, 1, 30.0)
    assert doc["code"]["usd"] == 51.0 and doc["code"]["truncated"] == 4
    assert _sources(staged, None, None) == {
        "chat": {"staged_samples": 10, "invalid": 1, "usd": None},
        "code": {"staged_samples": 10, "invalid": 0, "usd": None},
    }
    assert _sources(None, quality, 81.0) is None


def test_the_preflight_names_a_source_whose_samples_fail_a_gate(tmp_path: Any) -> None:
    from dflash_tasks.producer.preflight import judge

    store = LocalStore(tmp_path)
    store.write(output_key(0), encode_records(records()))
    report = judge(store, [0], QualitySettings(), 10.0, slots=8, workers=1, remaining=100, gpu_hour_usd=0.0)
    assert report.passed  # the job's sample as a whole passes ...
    assert list(report.source_failures) == ["code"]  # ... one source's does not, and is named
    assert "source code fails a gate: 40% of samples are truncated" in report.render()
    assert report.to_dict()["source_failures"]["code"][0].startswith("40% of samples are truncated")


def test_the_export_plan_counts_each_sources_rows_without_a_tokenizer() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 500, "reasoning_tokens": 450}
    turn: dict[str, Any] = {"status": "ok", "reasoning": "think it through", "content": "the answer"}
    turn["usage"] = usage
    turn |= {"finish_reason": "stop", "input": [{"role": "user", "content": "q"}]}
    records = [
        Record.from_json(json.dumps({"id": f"{src}:{i}", "source": src, "status": "ok", "turns": [turn]}))
        for src, n in (("code", 3), ("chat", 2))
        for i in range(n)
    ]
    job = JobDefinition.create("sha256:x", "p.jsonl", GenerationSpec(model="m"))
    planner = RowPlanner(job, TrainerView(), ExportOptions(layout="conversation"))
    assert len(list(planner.rows(records))) == 5 and not planner.counted
    doc = planner.per_source()
    assert doc is not None
    assert {name: f["rows_exported"] for name, f in doc.items()} == {"code": 3, "chat": 2}
    assert all(f["loss_tokens"] is None for f in doc.values())


def test_the_export_manifests_per_source_tokens_add_up_to_its_generated_total(tmp_path: Any) -> None:
    """Each source's output tokens are its records' turns' (a record without a stored total
    included) and its replaced attempts' (a failed one a repair round generated again), as the
    yield's generated total counts them: their sum is that total, for every figure derived."""
    chunk = records()
    lost = record(4, "code", ok=False, tokens=120)  # failed after generating 120 tokens
    untallied = {**record(0, "chat").to_dict()}
    untallied.pop("usage")  # its turns hold its tokens, the record no total
    chunk = [Record.from_dict(untallied), *chunk[1:14], lost, *chunk[15:]]
    store = LocalStore(tmp_path / "job")
    store.write(JOB_KEY, JOB.to_json())
    store.write(MANIFEST_KEY, Manifest(JOB.job_id, 20, 20, 0, 20, 1).to_json())
    store.write(output_key(0), encode_records(chunk))
    regenerated = record(4, "code", tokens=300)
    store.write(repair_key(0, 1), encode_records([regenerated]))

    doc = export(str(tmp_path / "job"), tmp_path / "train.jsonl", "jsonl", ExportOptions(), TrainerView())

    generated = doc["yield"]["generated_tokens"]
    assert generated == 3000 + 5100 + 300 + 120  # the current records, then the replaced attempt
    sources = doc["sources"]
    assert {name: s["output_tokens"] for name, s in sources.items()} == {"chat": 3000, "code": 5520}
    assert sum(s["output_tokens"] for s in sources.values()) == generated
    assert sum(s["cost_share"] for s in sources.values()) == pytest.approx(1.0, abs=1e-3)
    # report's sources.json, and a report without a trainer view: the same figures
    assert report_main(["--output", str(tmp_path / "job"), "--json", "--png", str(tmp_path / "r.png")]) == 0
    reported = json.loads(store.read(SOURCES_KEY))
    replaced = Superseded()
    replaced(lost, regenerated)
    current = [regenerated if r is lost else r for r in chunk]
    plain = build_report(JOB, current, 1, 1, superseded=replaced).sources.to_dict()
    for figures in (reported, plain):
        assert {name: s["output_tokens"] for name, s in figures.items()} == {"chat": 3000, "code": 5520}
