"""``verify`` accounts for turns: a record holds every turn up to the one that ended it, never a hole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition, output_key
from dflash_tasks.output.verify import verify
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store import LocalStore


def ok(content: str = "answer", finish: str = "stop") -> dict[str, Any]:
    return {"status": "ok", "content": content, "finish_reason": finish, "input": []}


FAILED: dict[str, Any] = {"status": "failed", "content": "", "finish_reason": None, "input": []}


def staged(tmp_path: Path, records: dict[str, list[dict[str, Any]]]) -> tuple[Path, LocalStore]:
    """An input of conversations with 1, 2 and 3 user turns, staged, with the given turns stored."""
    inp = tmp_path / "in.jsonl"
    lines = []
    for sid, k in (("a", 1), ("b", 2), ("c", 3)):
        messages = []
        for j in range(k):
            messages += [{"role": "user", "content": f"q{j}"}, {"role": "assistant", "content": "old"}]
        lines.append(json.dumps({"id": sid, "messages": messages}))
    inp.write_text("\n".join(lines) + "\n")
    store = LocalStore(tmp_path / "out")
    job = JobDefinition.create("sha256:x", "in.jsonl", GenerationSpec("m", chunk_size=3))
    store.write(JOB_KEY, job.to_json())
    stage_input(inp, store, job.job_id, 3)
    out = [{"id": sid, "status": turns[-1]["status"], "turns": turns} for sid, turns in records.items()]
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in out))
    return inp, store


def test_turns_up_to_a_failed_or_truncated_turn_account_for_the_rest(tmp_path: Path) -> None:
    inp, store = staged(tmp_path, {"a": [ok()], "b": [ok(), FAILED], "c": [ok(), ok("", "length")]})
    result = verify(str(inp), store)
    assert result.passed, result.problems
    assert (result.turns_expected, result.turns_generated, result.turns_not_sent) == (6, 5, 1)


def test_a_hole_or_a_missing_turn_fails(tmp_path: Path) -> None:
    inp, store = staged(tmp_path, {"a": [ok(), ok()], "b": [FAILED, ok()], "c": [ok(), ok()]})
    result = verify(str(inp), store)
    assert not result.passed and result.turn_mismatches == 3
    assert "sample 'a' has 2 turns recorded for 1 user turns" in result.problems[0]
    assert "with an unfinished turn before its last" in result.problems[1]
    assert "sample 'c' has 2 turns recorded for 3 user turns" in result.problems[2]
