"""Export to the drafter-training layout, and the quality report, on hand-made and real jobs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.quality import QualitySettings, check_record
from dflash_tasks.core.record import Record
from dflash_tasks.core.spec_stats import spec_counts
from dflash_tasks.output.export import ExportOptions, export
from dflash_tasks.output.report import build_report, render_png, render_text
from dflash_tasks.store import LocalStore
from tests.e2e.test_pipeline_e2e import enqueue_args, verify_ok
from tests.helpers import Processes, read_records, write_prompts

SPEC = GenerationSpec(model="m", chunk_size=3)


def rec(i: int, **overrides: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "id": f"s{i}",
        "line": i + 1,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"q{i}"}],
        "reasoning": f"thinking about q{i}",
        "content": f"answer {i}",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 300, "reasoning_tokens": 250},
        "status": "ok",
        "error": None,
    }
    r.update(overrides)
    r["checks"] = check_record(Record.from_dict(r), True, QualitySettings())
    return r


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A job of 8 samples in 3 chunks, the last chunk not done yet."""
    root = tmp_path / "job"
    store = LocalStore(root)
    store.write(JOB_KEY, JobDefinition.create("sha256:x", "in.jsonl", SPEC).to_json())
    store.write(MANIFEST_KEY, Manifest("j", 9, 9, 0, 3, 3).to_json())
    chunks = [
        [
            rec(0),
            rec(1, finish_reason="length"),
            rec(2, status="failed", error="HTTP 400: too long", content=""),
        ],
        [rec(3, content="<think>oops</think> 3"), rec(4), rec(5)],
    ]
    for n, records in enumerate(chunks):
        store.write(output_key(n), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return root


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_rows_are_in_input_order_with_the_trainer_layout(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    doc = export(str(job_dir), out, "jsonl", ExportOptions())
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["s0", "s4", "s5"]  # s1 is truncated: left out by default
    assert rows[0] == {
        "id": "s0",
        "status": "success",
        "conversations": [
            {"role": "system", "content": "Be brief.", "reasoning_content": None},
            {"role": "user", "content": "q0", "reasoning_content": None},
            {"role": "assistant", "content": "answer 0", "reasoning_content": "thinking about q0"},
        ],
    }
    assert doc["dropped"] == {"failed": 1, "truncated": 1, "think_marker": 1} and doc["rows"] == 3
    left_out = read_jsonl(tmp_path / "train.jsonl.dropped.jsonl")
    assert [(r["id"], r["reason"]) for r in left_out] == [
        ("s1", "truncated"),
        ("s2", "failed"),
        ("s3", "think_marker"),
    ]
    assert doc["dropped_file"] == "train.jsonl.dropped.jsonl" and doc["dropped_why"]["truncated"]
    assert doc["complete"] is False and doc["chunks_missing"] == 1
    assert doc["sha256"].startswith("sha256:") and doc["spec"]["spec"]["model"] == "m"
    assert json.loads((tmp_path / "train.jsonl.manifest.json").read_text()) == doc
    assert not any("<think>" in json.dumps(r) for r in rows)


def test_export_filters_drop_truncated_and_keep_failed(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    doc = export(str(job_dir), out, "jsonl", ExportOptions(frozenset({"truncated"}), keep_failed=True))
    rows = read_jsonl(out)
    assert [(r["id"], r["status"]) for r in rows] == [
        ("s0", "success"),
        ("s2", "failed"),
        ("s4", "success"),
        ("s5", "success"),
    ]
    failed = rows[1]
    assert failed["error"] == "HTTP 400: too long" and failed["conversations"][-1]["role"] == "user"
    assert doc["dropped"] == {"truncated": 1, "think_marker": 1} and doc["failed_kept"] == 1


def test_export_cli_rejects_an_unknown_check(job_dir: Path, tmp_path: Path) -> None:
    from dflash_tasks.output.export import main

    assert main(["--output", str(job_dir), "--to", str(tmp_path / "x.jsonl"), "--drop-check", "nope"]) == 2


def test_real_job_exports_loadable_by_datasets_and_reports_with_a_picture(
    procs: Processes, tmp_path: Path
) -> None:
    import datasets

    inp, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(inp, 150, bad_every=50, long_at=10)
    procs.worker(procs.simulator("--time-scale", "0.001", "--context-length", "8192"), "gpu0")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "16", "--no-preflight", "--wait"),
    )
    assert res.returncode == 0, res.stderr
    verify_ok(procs, inp, out)
    records = read_records(out)
    ok_ids = [r["id"] for r in sorted(records, key=lambda r: r["line"]) if r["status"] == "ok"]
    rejected = {"truncated", "empty_answer", "think_marker", "no_reasoning"}
    accepted = [
        r["id"]
        for r in sorted(records, key=lambda r: r["line"])
        if r["status"] == "ok" and not rejected & set(r["checks"])
    ]
    assert 0 < len(accepted) < len(ok_ids) == 146  # the simulator truncates some at max_tokens

    for fmt in ("jsonl", "parquet"):
        target = tmp_path / f"train.{fmt}"
        res = procs.run("dflash_tasks.output.export", "--output", str(out), "--to", str(target))
        assert res.returncode == 0, res.stderr
        loaded = datasets.load_dataset(
            "json" if fmt == "jsonl" else "parquet", data_files=str(target), split="train"
        )
        assert loaded["id"] == accepted and len(set(loaded["id"])) == len(accepted)
        row = loaded[0]
        assert row["status"] == "success" and row["conversations"][-1]["role"] == "assistant"
        (turn,) = next(r for r in records if r["id"] == row["id"])["turns"]
        assert row["conversations"][-1]["content"] == turn["content"]
        assert row["conversations"][-1]["reasoning_content"] == turn["reasoning"]
        assert [t["content"] for t in row["conversations"][:-1]] == [m["content"] for m in turn["input"]]
        assert f"left out {146 - len(accepted) + 1:,} rows the trainer would reject" in res.stderr

    report = procs.run("dflash_tasks.output.report", "--output", str(out), "--json")
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout.strip().splitlines()[-1])
    assert doc["samples"] == 147 and doc["failed"] == 1 and doc["checks"]["failed"] == 1
    assert doc["output_tokens"]["count"] == 146 and doc["output_tokens"]["p50"] > 500
    assert doc["reasoning_tokens"]["mean"] > 0 and doc["gates_passed"] is True
    accept = doc["spec_accept_length"]
    ok = [r for r in records if r["status"] == "ok"]
    assert (
        accept["count"] == 146 and 1 <= accept["min"] <= accept["p10"] <= accept["p50"] <= accept["max"] <= 4
    )
    assert accept["max"] - accept["min"] > 0.3  # a distribution: the simulator varies it per request
    tokens, verify = (sum(spec_counts(Record.from_dict(r))[i] for r in ok) for i in (0, 1))
    assert accept["overall"] == round(tokens / verify, 3)
    png = (out / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    text = procs.run("dflash_tasks.output.report", "--output", str(out), "--png", str(tmp_path / "r.png"))
    assert "output tokens" in text.stdout and "gates passed" in text.stdout
    assert f"accept length     overall {accept['overall']:.2f}" in text.stdout
    assert f"p10 {accept['p10']:.2f}" in text.stdout
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_report_accept_length_distribution_from_known_samples() -> None:
    job = JobDefinition.create("sha256:x", "in.jsonl", SPEC)
    pairs = [(300, 100), (100, 50), (400, 100), (200, 50), (90, 90)]  # 3.0, 2.0, 4.0, 4.0, 1.0
    records = [
        rec(
            i,
            usage={"prompt_tokens": 5, "completion_tokens": t, "reasoning_tokens": t // 2},
            meta_info={"spec_verify_ct": v, "spec_accept_length": t / v},
        )
        for i, (t, v) in enumerate(pairs)
    ]
    records.append(rec(9, meta_info=None))  # an old release: no per-request stats
    records.append(rec(8, status="failed", error="x", meta_info={"spec_verify_ct": 5}))
    report = build_report(job, [Record.from_dict(r) for r in records], 1, 1)
    doc = report.as_dict()["spec_accept_length"]
    assert doc["count"] == 5 and doc["overall"] == round(1090 / 390, 3)  # not the mean of ratios, 2.8
    assert (doc["min"], doc["p10"], doc["p25"], doc["p50"], doc["p90"], doc["max"]) == (
        1.0,
        1.0,
        2.0,
        3.0,
        4.0,
        4.0,
    )
    assert doc["mean"] == 2.8
    text = render_text(report)
    assert "accept length     overall 2.79 (Σ tokens / Σ verify passes)  min 1.00  p10 1.00" in text
    assert render_png(report).startswith(b"\x89PNG")
    none = build_report(job, [Record.from_dict(rec(0))], 1, 1)
    assert none.as_dict()["spec_accept_length"]["count"] == 0
    assert "no per-request speculative stats" in render_text(none)


@pytest.fixture
def messy_job(tmp_path: Path) -> Path:
    """Chunk 1 not done (chunk 2 is); two failed, two leaking markers, a sample stored twice, UTF-8."""
    root = tmp_path / "messy"
    store = LocalStore(root)
    store.write(JOB_KEY, JobDefinition.create("sha256:y", "in.jsonl", SPEC).to_json())
    store.write(MANIFEST_KEY, Manifest("j", 9, 9, 0, 3, 3).to_json())
    chunks = {
        0: [rec(0, content="café"), rec(1, status="failed", error="e1", content=""), rec(2, status="failed")],
        2: [rec(6, content="<think> a"), rec(7, reasoning="</think> b"), rec(8), rec(0), rec(8)],
    }
    for n, records in chunks.items():
        store.write(output_key(n), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return root


def test_export_counts_every_drop_and_describes_itself(messy_job: Path, tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    doc = export(str(messy_job), out, "jsonl", ExportOptions(frozenset({"truncated"}), keep_failed=True))
    assert "café".encode() in out.read_bytes()  # UTF-8 text, not \\u escapes
    rows = read_jsonl(out)
    assert [(r["id"], r["status"], r["error"]) for r in rows] == [
        ("s0", "success", None),
        ("s1", "failed", "e1"),
        ("s2", "failed", None),
        ("s8", "success", None),
    ]
    spec = json.loads(JobDefinition.create("sha256:y", "in.jsonl", SPEC).to_json())
    assert (doc["job_id"], doc["source"], doc["file"], doc["format"]) == (
        spec["job_id"],
        str(messy_job),
        "train.jsonl",
        "jsonl",
    )
    assert doc["sha256"] == "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest()
    assert (doc["rows"], doc["success"], doc["failed_kept"]) == (4, 2, 2)
    assert doc["dropped"] == {"think_marker": 2, "duplicate": 2}
    assert {"think_marker", "truncated"} <= set(doc["filters"]["drop_checks"])
    assert (doc["complete"], doc["chunks_missing"], doc["samples_in_job"], doc["spec"]) == (False, 1, 9, spec)
    plain = export(str(messy_job), tmp_path / "plain.jsonl", "jsonl", ExportOptions())
    assert plain["dropped"] == {"failed": 2, "think_marker": 2, "duplicate": 2} and plain["rows"] == 2
    assert all("error" not in r for r in read_jsonl(tmp_path / "plain.jsonl"))


def test_export_to_parquet_holds_the_same_rows(messy_job: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    export(str(messy_job), tmp_path / "a.jsonl", "jsonl", ExportOptions(keep_failed=True))
    doc = export(str(messy_job), tmp_path / "a.parquet", "parquet", ExportOptions(keep_failed=True))
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.column_names == ["id", "status", "conversations", "error"]
    assert table.to_pylist() == read_jsonl(tmp_path / "a.jsonl") and doc["rows"] == 4
    assert not (tmp_path / ".a.parquet.tmp").exists()
    export(str(messy_job), tmp_path / "b.parquet", "parquet", ExportOptions())
    assert pq.read_table(tmp_path / "b.parquet").column_names == ["id", "status", "conversations"]


def test_export_command_infers_the_format_and_reports_drops(
    messy_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_tasks.output.export import main

    to = tmp_path / "x.parquet"
    assert (
        main(["--output", str(messy_job), "--to", str(to), "--drop-truncated", "--drop-check", "short"]) == 0
    )
    manifest = json.loads((tmp_path / "x.parquet.manifest.json").read_text())
    assert manifest["format"] == "parquet"
    assert {"short", "think_marker", "truncated"} <= set(manifest["filters"]["drop_checks"])
    err = capsys.readouterr().err
    assert err.startswith("exported 2 rows") and f"to {to} (parquet)" in err
    assert "think_marker" in err and "WARNING: 1 chunks not done yet" in err and "--keep REASON" in err
    assert main(["--output", str(messy_job), "--to", str(tmp_path / "y.out"), "--keep-failed"]) == 0
    manifest = json.loads((tmp_path / "y.out.manifest.json").read_text())
    assert manifest["format"] == "jsonl" and "think_marker" in manifest["filters"]["drop_checks"]
    assert (
        "exported 4 rows" in capsys.readouterr().err
        and read_jsonl(tmp_path / "y.out")[1]["status"] == "failed"
    )
    assert main(["--output", str(messy_job), "--to", str(tmp_path / "z.jsonl"), "--drop-check", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --drop-check 'nope': not a check (one of failed, ")


def test_export_and_verify_commands_refuse_missing_or_bad_arguments(
    messy_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_tasks.output import export as export_cli
    from dflash_tasks.output import verify as verify_cli

    for main, argv in (
        (export_cli.main, ["--to", "x.jsonl"]),
        (export_cli.main, ["--output", str(messy_job)]),
        (export_cli.main, ["--output", str(messy_job), "--to", "x", "--format", "csv"]),
        (verify_cli.main, ["--output", str(messy_job)]),
        (verify_cli.main, ["--input", "p.jsonl"]),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert "error: " in capsys.readouterr().err
    assert (
        export_cli.main(["--output", str(messy_job), "--to", str(tmp_path / "f"), "--format", "parquet"]) == 0
    )
    assert json.loads((tmp_path / "f.manifest.json").read_text())["format"] == "parquet"


def test_parquet_is_written_in_batches(
    messy_job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from dflash_tasks.output import export as export_module

    monkeypatch.setattr(export_module, "_PARQUET_BATCH", 3)
    export(str(messy_job), tmp_path / "a.parquet", "parquet", ExportOptions(keep_failed=True))
    meta = pq.ParquetFile(tmp_path / "a.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [3, 1]
    assert [r["id"] for r in pq.read_table(tmp_path / "a.parquet").to_pylist()] == ["s0", "s1", "s2", "s8"]
    monkeypatch.setattr(export_module, "_PARQUET_BATCH", 1)  # a batch whose errors are all null
    export(str(messy_job), tmp_path / "b.parquet", "parquet", ExportOptions(keep_failed=True))
    assert (
        pq.read_table(tmp_path / "b.parquet").to_pylist() == pq.read_table(tmp_path / "a.parquet").to_pylist()
    )


def test_export_of_an_output_without_a_job_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_tasks.output.export import main

    half = LocalStore(tmp_path / "half")
    half.write(JOB_KEY, JobDefinition.create("sha256:z", "in.jsonl", SPEC).to_json())  # no manifest yet
    for root in (tmp_path / "none", tmp_path / "half"):
        assert main(["--output", str(root), "--to", str(tmp_path / "x.jsonl")]) == 2
        assert capsys.readouterr().err == f"error: {root} holds no staged job\n"


def test_export_json_prints_the_manifest_it_wrote(
    job_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_tasks.output.export import main as export_main

    out = tmp_path / "train.jsonl"
    assert export_main(["--output", str(job_dir), "--to", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.with_name(out.name + ".manifest.json").read_text())
    assert printed["rows"] == len(read_jsonl(out))
