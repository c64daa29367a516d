"""Export of multi-turn records: every assistant turn with its reasoning, and only rows the trainer takes.

The export is held to :mod:`tests.output.specforge_rules`, our restatement of SpecForge's
validator rules (``validate_regenerated_data.py --expect-reasoning --strict-think-markers``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.core.record import Record
from dflash_tasks.output.export import ExportOptions, export, main
from dflash_tasks.store import LocalStore
from tests.output.specforge_rules import check_row, validate_file

SYSTEM = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def turn(i: int, *, input: list[dict[str, str]] | None = None, **overrides: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "input": input if input is not None else [user(f"question {i}")],
        "reasoning": f"thinking {i}",
        "content": f"answer {i}",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 10, "completion_tokens": 300, "reasoning_tokens": 250},
        "status": "ok",
        "error": None,
        "latency_s": 1.0,
        "attempts": 1,
    }
    t.update(overrides)
    return t


def rec(
    sid: str, turns: list[dict[str, Any]], user_turns: int | None = None, thinking: bool = True
) -> dict[str, Any]:
    failed = turns[-1]["status"] != "ok"
    r: dict[str, Any] = {
        "id": sid,
        "line": 1,
        "user_turns": user_turns or len(turns),
        "turns": turns,
        "status": "failed" if failed else "ok",
        "error": "turn 2 of 3: HTTP 400: too long" if failed else None,
        "failed_turn": len(turns) if failed else None,
        "finish_reason": turns[-1]["finish_reason"],
    }
    checked = with_checks(Record.from_dict(r), thinking, QualitySettings())
    for t, read in zip(turns, checked.turns, strict=True):
        t["checks"] = list(read.checks or ())
    r["checks"] = list(checked.checks or ())
    return r


RECORDS = [
    rec("single", [turn(1, input=[SYSTEM, user("q")])]),
    rec("two", [turn(1, input=[SYSTEM, user("q1")]), turn(2)]),
    rec("three", [turn(1), turn(2), turn(3)]),
    rec("fails-on-2", [turn(1), turn(2, status="failed", reasoning="", content="", finish_reason=None)], 3),
    rec("cut-answer", [turn(1), turn(2, finish_reason="length")], 3),  # truncated, but has an answer
    rec("cut-thought", [turn(1, content="", finish_reason="length")], 2),
    rec("marker", [turn(1), turn(2, content="<THINK>oops")]),
    rec("no-thought", [turn(1), turn(2, reasoning="")]),
    rec("tool", [turn(1), turn(2, input=[{"role": "tool", "content": "42"}])]),
    rec("blank-user", [turn(1, input=[user("  ")])]),
    # turns: last: the source's old answer travels in the input, without reasoning
    rec("history", [turn(1, input=[user("q1"), {"role": "assistant", "content": "old"}, user("q2")])]),
]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    root = tmp_path / "job"
    store = LocalStore(root)
    store.write(
        JOB_KEY, JobDefinition.create("sha256:x", "in.jsonl", GenerationSpec("m", chunk_size=6)).to_json()
    )
    store.write(MANIFEST_KEY, Manifest("j", 11, 11, 0, 6, 2, turns=20, chunk_turns=[12, 8]).to_json())
    for chunk in range(2):
        part = RECORDS[chunk * 6 : chunk * 6 + 6]
        store.write(output_key(chunk), b"".join(json.dumps(r).encode() + b"\n" for r in part))
    return root


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_default_export_holds_every_turn_and_passes_the_trainers_rules(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    doc = export(str(job_dir), out, "jsonl", ExportOptions(mode="validator"))
    summary = validate_file(out, expect_reasoning=True, strict_think_markers=True)
    rows = rows_of(out)
    assert [r["id"] for r in rows] == ["single", "two", "three"]
    assert summary.rows == 3 and summary.assistant_messages == 6 == doc["assistant_turns"]
    assert rows[2]["conversations"] == [
        {"role": "user", "content": "question 1", "reasoning_content": None},
        {"role": "assistant", "content": "answer 1", "reasoning_content": "thinking 1"},
        {"role": "user", "content": "question 2", "reasoning_content": None},
        {"role": "assistant", "content": "answer 2", "reasoning_content": "thinking 2"},
        {"role": "user", "content": "question 3", "reasoning_content": None},
        {"role": "assistant", "content": "answer 3", "reasoning_content": "thinking 3"},
    ]
    assert doc["multi_turn_rows"] == 2 and doc["rows"] == 3
    assert doc["dropped"] == {
        "failed": 1,
        "truncated": 2,
        "think_marker": 1,
        "no_reasoning": 1,
        "unsupported_role": 1,
        "empty_message": 1,
        "source_answers": 1,
    }
    left_out = {r["id"]: r for r in rows_of(tmp_path / "train.jsonl.dropped.jsonl")}
    assert left_out["fails-on-2"]["detail"] == "turn 2 of 3: HTTP 400: too long"
    assert left_out["tool"]["detail"] == "message 2 has unsupported role 'tool'"
    assert set(doc["dropped_why"]) == set(doc["dropped"]) and doc["filters"]["expect_reasoning"] is True


def test_kept_rejects_need_an_explicit_flag(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    doc = export(str(job_dir), out, "jsonl", ExportOptions(mode="validator", keep=frozenset({"truncated"})))
    assert [r["id"] for r in rows_of(out)] == ["single", "two", "three", "cut-answer"]
    assert doc["kept_despite"] == {"truncated": 1} and doc["dropped"]["empty_answer"] == 1  # cut-thought
    validate_file(out, expect_reasoning=True, strict_think_markers=True)  # a cut answer is still well formed
    doc = export(
        str(job_dir),
        out,
        "jsonl",
        ExportOptions(mode="validator", keep=frozenset({"unsupported_role"}), keep_failed=True),
    )
    rows = {r["id"]: r for r in rows_of(out)}
    assert (
        rows["fails-on-2"]["status"] == "failed" and rows["fails-on-2"]["conversations"][-1]["role"] == "user"
    )
    assert [m["role"] for m in rows["tool"]["conversations"]] == ["user", "assistant", "tool", "assistant"]
    with pytest.raises(ValueError, match=r"^line 4: status must be 'success'$"):
        validate_file(out, expect_reasoning=True, strict_think_markers=True)


def test_kept_source_answers_are_what_specforge_rejected_before(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    doc = export(
        str(job_dir), out, "jsonl", ExportOptions(mode="validator", keep=frozenset({"source_answers"}))
    )
    rows = {r["id"]: r for r in rows_of(out)}
    assert doc["kept_despite"] == {"source_answers": 1}
    assert [m["reasoning_content"] for m in rows["history"]["conversations"]] == [
        None,
        None,
        None,
        "thinking 1",
    ]
    with pytest.raises(ValueError, match="line 4: assistant message 1 has empty reasoning_content"):
        validate_file(out, expect_reasoning=True, strict_think_markers=True)


def test_the_cli_prints_the_count_per_reason(
    job_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--output", str(job_dir), "--to", str(tmp_path / "x.jsonl"), "--mode", "validator"]) == 0
    err = capsys.readouterr().err
    assert "exported 3 rows, 2 multi-turn (6 assistant turns)" in err
    assert "left out 8 rows the trainer would reject (listed in x.jsonl.dropped.jsonl)" in err
    assert "  truncated                     2  a turn hit max_tokens" in err
    assert "--keep REASON" in err
    assert main(["--output", str(job_dir), "--to", str(tmp_path / "x.jsonl"), "--keep", "nope"]) == 2
    assert "--keep 'nope': not a reason" in capsys.readouterr().err


def test_a_thinking_off_job_leaves_out_rows_with_reasoning(tmp_path: Path) -> None:
    root = tmp_path / "off"
    store = LocalStore(root)
    spec = GenerationSpec("m", thinking=False, chunk_size=2)
    store.write(JOB_KEY, JobDefinition.create("sha256:y", "in.jsonl", spec).to_json())
    store.write(MANIFEST_KEY, Manifest("j", 2, 2, 0, 2, 1).to_json())
    records = [
        rec("plain", [turn(1, reasoning="")], thinking=False),
        rec("reasons", [turn(1)], thinking=False),
    ]
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    out = tmp_path / "off.jsonl"
    doc = export(str(root), out, "jsonl", ExportOptions(mode="validator"))
    assert [r["id"] for r in rows_of(out)] == ["plain"] and doc["dropped"] == {"unexpected_reasoning": 1}
    validate_file(out, expect_non_reasoning=True, strict_think_markers=True)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": " ", "status": "success", "conversations": []}, "id must be a non-empty string"),
        ({"id": "a", "status": "failed", "conversations": []}, "status must be 'success'"),
        ({"id": "a", "status": "success", "messages": []}, "conversations must be a non-empty list"),
        (
            {
                "id": "a",
                "status": "success",
                "conversations": [user("q"), {"role": "assistant", "content": ""}],
            },
            "message 1 content must be a non-empty string",
        ),
        (
            {
                "id": "a",
                "status": "success",
                "conversations": [user("q"), {"role": "assistant", "content": "x"}],
            },
            "assistant message 1 has empty reasoning_content",
        ),
        (
            {
                "id": "a",
                "status": "success",
                "conversations": [
                    user("q"),
                    {"role": "assistant", "content": "</Think> x", "reasoning_content": "r"},
                ],
            },
            "assistant message 1 contains a thinking marker",
        ),
        (
            {"id": "a", "status": "success", "conversations": [user("q1"), user("q2")]},
            "message 1 expected role 'assistant', got 'user'",
        ),
        (
            {"id": "a", "status": "success", "conversations": [SYSTEM, user("q")]},
            "conversation has no assistant message",
        ),
    ],
)
def test_our_restatement_of_the_rules_rejects_what_specforge_rejects(
    row: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_row(row, expect_reasoning=True, expect_non_reasoning=False, strict_think_markers=True)
