"""Unit tests of the per-sample checks, the gates, the live-gate window and the preflight choice."""

from __future__ import annotations

from typing import Any

import pytest

from dflash_tasks.core.job import Manifest
from dflash_tasks.core.quality import QualitySettings, check_record, count_checks, evaluate_gates
from dflash_tasks.core.record import Record
from dflash_tasks.producer.preflight import preflight_chunks
from workers.checks.live_gate import window_counts

SETTINGS = QualitySettings()


def raw(**overrides: Any) -> dict[str, Any]:
    """A stored one-turn record (the shape from before multi-turn support), as JSON decodes it."""
    base: dict[str, Any] = {
        "status": "ok",
        "reasoning": "Let me think about 6 * 7 carefully.",
        "content": "42",
        "finish_reason": "stop",
        "usage": {"completion_tokens": 900},
    }
    base.update(overrides)
    return base


def stored(doc: dict[str, Any]) -> Record:
    return Record.from_dict({"id": "s", **doc})


def record(**overrides: Any) -> Record:
    return stored(raw(**overrides))


def test_good_thinking_sample_passes_every_check() -> None:
    assert check_record(record(), thinking=True, settings=SETTINGS) == []


@pytest.mark.parametrize("reasoning", ["", "   ", "\n\n", None])
def test_missing_or_whitespace_reasoning_with_thinking_on(reasoning: str | None) -> None:
    assert "no_reasoning" in check_record(record(reasoning=reasoning), thinking=True, settings=SETTINGS)


def test_reasoning_with_thinking_off_is_flagged() -> None:
    assert check_record(record(), thinking=False, settings=SETTINGS) == ["unexpected_reasoning"]
    assert check_record(record(reasoning=""), thinking=False, settings=SETTINGS) == []


@pytest.mark.parametrize(
    ("field", "text"),
    [("content", "<think>x</think> 42"), ("content", "42 </think>"), ("reasoning", "a <think> b")],
)
def test_think_markers_leaking_into_either_field(field: str, text: str) -> None:
    assert "think_marker" in check_record(record(**{field: text}), thinking=True, settings=SETTINGS)


def test_truncated_thought_with_no_answer() -> None:
    checks = check_record(
        record(content="", finish_reason="length", usage={"completion_tokens": 4096}),
        thinking=True,
        settings=SETTINGS,
    )
    assert checks == ["empty_answer", "truncated"]


def test_truncated_after_the_answer_started_is_only_truncated() -> None:
    checks = check_record(record(finish_reason="length"), thinking=True, settings=SETTINGS)
    assert checks == ["truncated"]


def test_empty_answer_and_short_completion() -> None:
    checks = check_record(
        record(content="  ", usage={"completion_tokens": 6}), thinking=True, settings=SETTINGS
    )
    assert checks == ["empty_answer", "short"]
    strict = QualitySettings(min_completion_tokens=1000)
    assert check_record(record(), thinking=True, settings=strict) == ["short"]


def test_a_short_answer_without_thinking_is_not_flagged_short() -> None:
    # "42" in six tokens is a right answer when thinking is off; with thinking on it is the seed's failure.
    short_answer = record(reasoning="", usage={"completion_tokens": 6})
    assert check_record(short_answer, thinking=False, settings=SETTINGS) == []
    assert check_record(short_answer, thinking=True, settings=SETTINGS) == ["no_reasoning", "short"]


def test_a_think_marker_split_across_reasoning_and_answer_is_not_a_marker() -> None:
    assert check_record(record(reasoning="a <thi", content="nk> b"), thinking=True, settings=SETTINGS) == []


def test_failed_request_is_only_failed() -> None:
    assert check_record(
        stored({"status": "failed", "error": "HTTP 400"}), thinking=True, settings=SETTINGS
    ) == ["failed"]


def test_the_seeds_dataset_fails_the_gates_with_the_likely_cause() -> None:
    # 87% of samples without thinking: a six-token answer and no reasoning.
    records = [stored({"checks": ["no_reasoning", "short"]})] * 87 + [stored({"checks": []})] * 13
    total, counts = count_checks(records)
    failures = evaluate_gates(total, counts, SETTINGS)
    assert [f.check for f in failures] == ["no_reasoning", "short"]
    assert failures[0].message == (
        "87% of samples have no reasoning: is enable_thinking on and the server started with a "
        "reasoning parser (--reasoning-parser qwen3)?"
    )


def test_gates_pass_below_every_threshold_and_trip_just_above() -> None:
    assert evaluate_gates(100, {"truncated": 30, "no_reasoning": 10}, SETTINGS) == []
    assert [f.check for f in evaluate_gates(100, {"truncated": 31}, SETTINGS)] == ["truncated"]
    assert evaluate_gates(0, {}, SETTINGS) == []


def test_quality_settings_round_trip_and_partial_overrides() -> None:
    custom = QualitySettings(min_completion_tokens=8, max_share={**SETTINGS.max_share, "truncated": 0.5})
    assert QualitySettings.from_dict(custom.to_dict()) == custom
    partial = QualitySettings.from_dict({"max_share": {"no_reasoning": 0.01}})
    assert partial.max_share["no_reasoning"] == 0.01 and partial.max_share["truncated"] == 0.30
    assert QualitySettings.from_dict(None) == QualitySettings()


def test_live_window_sums_newest_entries_until_it_covers_the_window() -> None:
    entries = [{"n": 64, "checks": {"no_reasoning": 64}}] * 3 + [{"n": 64, "checks": {}}] * 10
    total, counts = window_counts(entries, 150)
    assert total == 192 and counts["no_reasoning"] == 192
    total, counts = window_counts(entries, 10_000)
    assert total == 13 * 64 and counts["no_reasoning"] == 192


@pytest.mark.parametrize(
    ("chunks", "size", "samples", "expected"),
    [
        (100, 64, 200, [0, 33, 66, 99]),
        (3, 64, 200, [0, 1, 2]),
        (10, 64, 1, [0]),
        (1000, 10, 50, [0, 250, 500, 749, 999]),
    ],
)
def test_preflight_chunks_are_spread_over_the_input(
    chunks: int, size: int, samples: int, expected: list[int]
) -> None:
    manifest = Manifest(
        job_id="j", lines=chunks * size, samples=chunks * size, invalid=0, chunk_size=size, chunks=chunks
    )
    assert preflight_chunks(manifest, samples) == expected


def test_checks_run_per_turn_and_the_record_carries_their_union() -> None:
    from dflash_tasks.core.quality import with_checks

    turns = [raw(), raw(finish_reason="length"), raw(reasoning="", content="<THINK> 42")]
    rec = with_checks(stored({"status": "ok", "turns": turns}), thinking=True, settings=SETTINGS)
    assert rec.checks == ("no_reasoning", "think_marker", "truncated")
    assert [t.checks for t in rec.turns] == [(), ("truncated",), ("no_reasoning", "think_marker")]
    failed = stored({"status": "failed", "turns": [raw(), {"status": "failed", "error": "400"}]})
    failed = with_checks(failed, thinking=True, settings=SETTINGS)
    assert failed.checks == ("failed",)
    assert failed.turns[0].checks == () and failed.turns[1].checks == ("failed",)
    assert failed.to_dict()["checks"] == ["failed"]  # stored as a list


def test_preflight_adds_a_multi_turn_chunk_when_the_spread_misses_them() -> None:
    turns = [64] * 100
    turns[50] = 150  # the only chunk with conversations of several turns
    manifest = Manifest("j", 6400, 6400, 0, 64, 100, turns=sum(turns), chunk_turns=turns)
    assert preflight_chunks(manifest, 200) == [0, 33, 50, 66, 99]
    turns[33] = 100  # the spread already holds one: nothing added
    manifest = Manifest("j", 6400, 6400, 0, 64, 100, turns=sum(turns), chunk_turns=turns)
    assert preflight_chunks(manifest, 200) == [0, 33, 66, 99]


def test_short_is_strictly_below_the_minimum_and_missing_usage_counts_as_zero() -> None:
    settings = QualitySettings(min_completion_tokens=1)
    no_usage = stored({k: v for k, v in raw().items() if k != "usage"})
    assert check_record(no_usage, True, settings) == ["short"]
    at_minimum = record(usage={"completion_tokens": 32})
    assert check_record(at_minimum, True, QualitySettings()) == []


def test_gates_judge_a_single_sample_and_checks_nobody_failed() -> None:
    assert [f.check for f in evaluate_gates(1, {"failed": 1}, QualitySettings())] == ["failed"]
    assert evaluate_gates(0, {"failed": 3}, QualitySettings()) == []
    only_some = evaluate_gates(10, {"short": 5}, QualitySettings())  # the other checks absent
    assert [(f.check, f.share) for f in only_some] == [("short", 0.5)]


def test_every_setting_survives_the_round_trip() -> None:
    custom = QualitySettings(min_completion_tokens=7, max_share={"failed": 0.5}, window=40, min_samples=9)
    back = QualitySettings.from_dict(custom.to_dict())
    assert (back.min_completion_tokens, back.window, back.min_samples) == (7, 40, 9)
    assert back.max_share["failed"] == 0.5 and back.max_share["short"] == 0.25  # defaults fill the rest


def test_the_gates_judge_all_but_transient_failures() -> None:
    from dflash_tasks.core.quality import judged
    from dflash_tasks.core.record import Record, Turn
    from dflash_tasks.core.states import FailureKind, Outcome, RecordStatus

    def failed(sample_id: str, kind: FailureKind | None) -> Record:
        turn = Turn(status=RecordStatus.FAILED, failure=kind)
        return Record(
            id=sample_id,
            user_turns=1,
            turns=(turn,),
            outcome=Outcome.FAILED,
            status=RecordStatus.FAILED,
            failure=kind,
        )

    ok = Record(
        id="ok",
        user_turns=1,
        turns=(Turn(status=RecordStatus.OK, content="c"),),
        outcome=Outcome.COMPLETE,
        status=RecordStatus.OK,
    )
    records = [
        ok,
        failed("400", FailureKind.PERMANENT),
        failed("500", FailureKind.TRANSIENT),
        failed("old", None),
    ]
    assert [r.id for r in judged(records)] == ["ok", "400"]  # a repair round regenerates the others


def test_a_truncated_sample_is_repaired_only_below_the_amended_budget() -> None:
    from dflash_tasks.core.record import Record, Turn
    from dflash_tasks.core.repair import needs_repair
    from dflash_tasks.core.states import Outcome, RecordStatus

    def cut(budget: int) -> Record:
        turn = Turn(status=RecordStatus.OK, finish_reason="length", content="c")
        return Record(
            id="t",
            user_turns=1,
            turns=(turn,),
            outcome=Outcome.TRUNCATED,
            status=RecordStatus.OK,
            finish_reason="length",
            sampling={"max_tokens": budget},
        )

    assert not needs_repair(cut(300))  # no amendment: a truncated sample is kept
    assert needs_repair(cut(300), max_tokens=4000) and not needs_repair(cut(4000), max_tokens=4000)
