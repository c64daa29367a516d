"""The export never writes a loop: on an output directory written by hand in the store's format,
with the tests' tiny Qwen3-style tokenizer counting rows at a ``max_length`` of 200.

``long`` looped 800 tokens into its thought (past the trainer's horizon), ``short`` 20 tokens in;
``fine`` finished. Each loop is 200 tokens of ``delta alpha``, a phrase no other text holds.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.export_rows import (
    DEFAULT_DROPS,
    conversation_candidate,
    per_turn_candidates,
    prefix_messages,
)
from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY, GenerationSpec, JobDefinition, Manifest, output_key
from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.record import Record
from dflash_tasks.core.repetition import FINISH_REASON
from dflash_tasks.core.row_planner import ExportOptions
from dflash_tasks.output.export import export
from dflash_tasks.output.report import main as report_main
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore
from tests.output.test_yield_export import VIEW, rec, rows_of, thought, turn

LOOP = " delta alpha" * 100  # 200 tokens


def looped(i: int, pairs: int) -> dict[str, Any]:
    """A turn stopped in a loop after a thought of ``pairs`` pairs (2 tokens each)."""
    t = turn(i, pairs, cut=True)
    prefix = thought(pairs)
    t["reasoning"] = prefix + LOOP
    t["finish_reason"] = FINISH_REASON
    t["usage"]["completion_tokens"] = 2 * pairs + 200
    t["loop"] = {
        "start_char": len(prefix),
        "start_token": 2 * pairs,
        "period_chars": len(" delta alpha"),
        "copies": 100.0,
        "detected_char": len(prefix + LOOP),
        "detected_token": 2 * pairs + 200,
        "text": "reasoning",
    }
    return t


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_model_dir(tmp_path_factory.mktemp("models"), QWEN3_TEMPLATE))


def job_dir(root: Path, model: str, on_loop: OnLoop) -> Path:
    records = [
        rec("long", [looped(1, 400)], model),
        rec("short", [looped(1, 10)], model),
        rec("fine", [turn(1, 20)], model),
        rec("second", [turn(1, 15), looped(2, 10)], model, 3),  # its first turn is fine
    ]
    for r in records:
        r["sampling"] = {"max_tokens": 4096}
    store = LocalStore(root)
    spec = GenerationSpec("m", chunk_size=4)
    job = JobDefinition.create("sha256:x", "in.jsonl", spec, QualitySettings(on_loop=on_loop))
    store.write(JOB_KEY, job.to_json())
    store.write(MANIFEST_KEY, Manifest("j", 4, 4, 0, 4, 1, turns=5, chunk_turns=[5]).to_json())
    store.write(output_key(0), b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return root


def exported(tmp_path: Path, model: str, on_loop: OnLoop, **options: Any) -> tuple[list[Any], dict[str, Any]]:
    root = job_dir(tmp_path / "job", model, on_loop)
    out = tmp_path / "train.jsonl"
    doc = export(str(root), out, "jsonl", ExportOptions(**options), VIEW)
    rows = rows_of(out)
    assert "delta alpha" not in out.read_text()  # no loop, whatever the policy
    return rows, doc


@pytest.mark.parametrize("policy", ["regenerate", "drop"])
def test_looped_rows_are_left_out_as_looping_and_their_tokens_go_to_looping(
    tmp_path: Path, model: str, policy: str
) -> None:
    rows, doc = exported(tmp_path, model, OnLoop(policy))
    assert [r["id"] for r in rows] == ["fine", "second#turn0"]
    assert doc["dropped"] == {"looping": 3}
    details = [json.loads(line)["detail"] for line in (tmp_path / "train.jsonl.dropped.jsonl").open()]
    assert f"stopped in a loop of its reasoning at token 800 (--on-loop {policy})" in details
    rest = doc["yield"]["where_the_rest_went"]
    assert rest["looping"] == (800 + 200) + (20 + 200) + (20 + 200) and "looping" not in rest["dropped_rows"]


def test_prefix_keeps_a_long_enough_thought_up_to_its_loop_as_a_cut_row(tmp_path: Path, model: str) -> None:
    rows, doc = exported(tmp_path, model, OnLoop("prefix", 100))
    assert [r["id"] for r in rows] == ["long", "fine", "second#turn0"]
    answer = rows[0]["conversations"][-1]
    assert answer == {"role": "assistant", "content": "", "reasoning_content": thought(400)}
    assert doc["yield"]["rows_written_by_horizon_rule"] == 1  # cut past the trainer's horizon
    assert doc["dropped"] == {"looping": 2}  # 20-token prefixes: under the minimum, regenerated
    assert doc["yield"]["where_the_rest_went"]["looping"] == 200 + 220 + 220  # long's loop is never trained


def test_a_kept_prefix_short_of_the_horizon_is_truncated_as_a_cut_thought_is(
    tmp_path: Path, model: str
) -> None:
    rows, doc = exported(tmp_path, model, OnLoop("prefix", 10))
    assert [r["id"] for r in rows] == ["long", "fine", "second#turn0"]
    assert doc["dropped"] == {"truncated": 2}  # 20-token prefixes end short of max_length 200
    rest = doc["yield"]["where_the_rest_went"]
    assert rest["dropped_rows"] == {"truncated": 20 + 20} and rest["looping"] == 200 * 3
    at_loop = "cut where its loop starts, token 20 of its reasoning (20 tokens kept), "
    for detail in left_out_details(tmp_path).values():  # the cut is the loop's start, not max_tokens
        assert detail.startswith(at_loop) and detail.endswith(
            "short of the trainer's max_length 200: a loop's prefix is not continued"
        ), detail
    _, validator = exported(tmp_path, model, OnLoop("prefix", 10), mode="validator")
    assert validator["dropped"] == {"truncated": 3}  # every cut row, the long prefix included
    assert (
        left_out_details(tmp_path)["long"]
        == "cut where its loop starts, token 800 of its reasoning (800 tokens kept)"
    )


def left_out_details(tmp_path: Path) -> dict[str, str]:
    """The detail of each row the last export left out, by row id."""
    lines = (tmp_path / "train.jsonl.dropped.jsonl").read_text().splitlines()
    return {doc["id"]: doc["detail"] for doc in map(json.loads, lines)}


@pytest.mark.parametrize("layout", ["per-turn", "conversation"])
def test_looping_is_a_default_drop_check_applied_once_and_spared_where_the_prefix_is_kept(
    layout: str,
) -> None:
    record = Record.from_dict(rec("long", [looped(1, 400)], "m"))
    bare = Record.from_dict({**rec("long", [looped(1, 400)], "m"), "checks": None})  # checks not stored
    bare = replace(bare, turns=tuple(replace(t, checks=None) for t in bare.turns))

    def reasons(r: Record, drop_checks: frozenset[str], on_loop: OnLoop) -> list[str]:
        if layout == "per-turn":
            (c,) = per_turn_candidates(r, True, drop_checks, on_loop=on_loop)
        else:
            c = conversation_candidate(r, True, drop_checks, False, on_loop)
        return [reason for reason, _ in c.reasons]

    assert "looping" in DEFAULT_DROPS
    for explicit in (frozenset(), frozenset({"looping"})):  # --drop-check looping: the same, once
        for r in (record, bare):
            # its thought looped: no answer, counted as the loop's (not empty_answer); cut short
            assert reasons(r, explicit, OnLoop()) == ["looping", "truncated", "empty_message"]
            assert reasons(r, explicit, OnLoop("prefix", 100)) == ["truncated", "empty_message"]


def test_drop_check_looping_given_explicitly_changes_nothing(tmp_path: Path, model: str) -> None:
    for policy in (OnLoop(), OnLoop("prefix", 100)):
        default = exported(tmp_path / policy.policy / "default", model, policy)
        explicit = exported(
            tmp_path / policy.policy / "explicit", model, policy, drop_checks=frozenset({"looping"})
        )
        assert explicit[0] == default[0]
        for key in ("dropped", "kept_despite", "yield"):
            assert explicit[1][key] == default[1][key]
        assert explicit[1]["filters"]["drop_checks"].count("looping") == 1


@pytest.mark.parametrize("layout", ["auto", "conversation"])  # auto: per-turn rows here
def test_keep_looping_writes_rows_cut_where_the_loop_starts_never_the_loop(
    tmp_path: Path, model: str, layout: str
) -> None:
    rows, doc = exported(tmp_path, model, OnLoop(), keep=frozenset({"looping"}), layout=layout)
    # per-turn, the second sample's first turn is a row of its own; as a conversation it is truncated
    assert [r["id"] for r in rows] == ["long", "fine"] + (["second#turn0"] if layout == "auto" else [])
    assert rows[0]["conversations"][-1]["reasoning_content"] == thought(400)
    assert doc["kept_despite"] == {"looping": 1} and doc["dropped"] == {"truncated": 2}


def test_report_states_the_looping_share_and_the_tokens_saved(
    tmp_path: Path, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = job_dir(tmp_path / "job", model, OnLoop())
    assert report_main(["--output", str(root), "--json", "--tokenizer", model]) == ExitCode.NOT_PASSED
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = (4096 - 1000) + (4096 - 220) * 2
    assert doc["loops"] == {"samples": 3, "share": 0.75, "tokens_saved": saved}
    assert doc["yield"]["where_the_rest_went"]["looping"] == 1000 + 220 + 220
    assert any("fall into a loop" in m for m in doc["gate_failures"])


def answer_looped() -> dict[str, Any]:
    """A finished thought whose answer looped after ``gamma delta``."""
    t = turn(1, 10)
    t["content"] = "gamma delta" + LOOP
    t["finish_reason"] = FINISH_REASON
    t["loop"] = {
        "start_char": len("gamma delta"),
        "start_token": 2,
        "period_chars": len(" delta alpha"),
        "copies": 100.0,
        "detected_char": len(t["content"]),
        "detected_token": 202,
        "text": "content",
    }
    return t


def test_the_history_after_a_looped_turn_holds_only_its_text_before_the_loop() -> None:
    """A looped turn ends its conversation today; were one followed, the rows and prefixes after it
    would still carry its answer only up to where it loops."""
    first, second = answer_looped(), turn(2, 5)
    record = Record.from_dict({"id": "s", "user_turns": 2, "turns": [first, second], "status": "ok"})
    rows = [c.row for c in per_turn_candidates(record, True, frozenset())]
    assert rows[1]["conversations"][1]["content"] == "gamma delta"
    inputs = [first["input"], second["input"], [{"role": "user", "content": "alpha 3"}]]
    for per_turn in (True, False):
        messages = prefix_messages(inputs, record.turns[:1], per_turn)
        assert messages[1]["content"] == "gamma delta"
    assert "delta alpha" not in json.dumps(rows) + json.dumps(prefix_messages(inputs, record.turns, False))
