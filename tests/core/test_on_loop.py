"""A sample stopped in a loop: its check and gate, what each ``--on-loop`` policy does with it in the
repair rounds, and its counts (tokens saved, looped tokens in the yield). Records are made by hand
(the record contract of a looped turn, as the streaming worker writes it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dflash_tasks.core.on_loop import (
    LOOPED_COUNTER,
    SAVED_COUNTER,
    OnLoop,
    loop_counters,
    loop_figures,
    loop_tokens,
    tokens_before_loop,
    tokens_saved,
)
from dflash_tasks.core.quality import (
    GREEDY_LOOPING_HINT,
    QualitySettings,
    check_turn,
    evaluate_gates,
    with_checks,
)
from dflash_tasks.core.record import Record, Turn, Usage, outcome_of
from dflash_tasks.core.record_parts import Part
from dflash_tasks.core.repair import Superseded, needs_repair, superseded
from dflash_tasks.core.repetition import FINISH_REASON, Loop
from dflash_tasks.core.states import RecordStatus
from dflash_tasks.core.yields import YieldTally
from tests.core.test_record import record, turn

PREFIX = "Let me work through this carefully. " * 20  # 720 characters
LOOP = "Wait, that is not right, let me redo it. " * 40


def looped_turn(start_token: int = 180, completion: int = 600, text: str = "reasoning") -> Turn:
    """A turn stopped in a loop ``start_token`` tokens in, after ``completion`` tokens."""
    loop = Loop(
        start_char=len(PREFIX),
        start_token=start_token,
        period_chars=41,
        copies=10.0,
        detected_char=len(PREFIX) + 410,
        detected_token=completion,
        text=text,
    )
    thought, answer = (PREFIX + LOOP, "") if text == "reasoning" else ("thought", PREFIX + LOOP)
    return turn(
        reasoning=thought,
        content=answer,
        finish_reason=FINISH_REASON,
        usage=Usage(5, completion, completion if text == "reasoning" else 50),
        loop=loop,
    )


def looped(*earlier: Turn, last: Turn | None = None, max_tokens: int = 4096) -> Record:
    turns = (*earlier, last or looped_turn())
    r = record(*turns)
    return replace(r, outcome=outcome_of(turns, len(turns)), sampling={"max_tokens": max_tokens})


# --- the check and the gate ---------------------------------------------------------------------


def test_a_looped_turn_fails_the_looping_check_not_empty_answer() -> None:
    """Its thought looped, so it has no answer: that is the loop's doing, counted and gated once,
    under ``looping`` (whose hint names the cause), not also under ``empty_answer`` (whose hint
    says to raise --max-tokens)."""
    assert check_turn(looped_turn(), True, QualitySettings()) == ["looping"]
    assert "looping" not in check_turn(turn(), True, QualitySettings())
    assert with_checks(looped(turn()), True, QualitySettings()).checks == ("looping",)
    unlooped = replace(looped_turn(), loop=None, finish_reason="stop")
    assert check_turn(unlooped, True, QualitySettings()) == ["empty_answer"]


def test_the_looping_gate_trips_above_ten_percent_and_names_greedy_decoding_at_temperature_zero() -> None:
    settings = QualitySettings()
    assert settings.max_share["looping"] == 0.10
    assert evaluate_gates(100, {"looping": 10}, settings) == []
    (greedy,) = evaluate_gates(100, {"looping": 11}, settings, temperature=0.0)
    assert greedy.check == "looping" and greedy.hint == GREEDY_LOOPING_HINT
    assert "11% of samples fall into a loop" in greedy.message and "raise --temperature" in greedy.message
    (sampled,) = evaluate_gates(100, {"looping": 11}, settings, temperature=0.6)
    assert "temperature 0" not in sampled.message and "presence_penalty" in sampled.message
    assert evaluate_gates(100, {"looping": 11}, QualitySettings(max_share={"looping": 0.2})) == []


# --- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("", OnLoop()),
        ("regenerate", OnLoop("regenerate")),
        ("drop", OnLoop("drop")),
        ("prefix", OnLoop("prefix")),
        ("PREFIX=2048", OnLoop("prefix", 2048)),
    ],
)
def test_on_loop_values(text: str, policy: OnLoop) -> None:
    assert OnLoop.parse(text) == policy
    assert OnLoop.from_dict(policy.to_dict()) == policy
    assert QualitySettings.from_dict(QualitySettings(on_loop=policy).to_dict()).on_loop == policy


@pytest.mark.parametrize(("text", "why"), [("again", "one of"), ("drop=3", "only prefix"), ("prefix=x", "x")])
def test_bad_on_loop_values_are_named(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        OnLoop.parse(text)


def test_which_looped_samples_a_repair_round_regenerates_under_each_policy() -> None:
    long_prefix, short_prefix = looped(last=looped_turn(start_token=2000, completion=2600)), looped()
    finished = record()
    for sample in (long_prefix, short_prefix):
        assert needs_repair(sample, on_loop=OnLoop())  # regenerate, the default
        assert not needs_repair(sample, on_loop=OnLoop("drop"))
        assert not needs_repair(sample)  # a caller that passes no policy regenerates none
    assert not needs_repair(long_prefix, on_loop=OnLoop("prefix", 1024))  # kept up to its loop
    assert needs_repair(short_prefix, on_loop=OnLoop("prefix", 1024))  # too short to train on
    assert not needs_repair(finished, on_loop=OnLoop())


def test_an_answer_that_loops_keeps_its_thought_in_the_prefix() -> None:
    answer_loop = looped_turn(start_token=100, completion=600, text="content")
    assert tokens_before_loop(answer_loop) == 50 + 100 and loop_tokens(answer_loop) == 450
    assert answer_loop.before_loop() == ("thought", PREFIX)


# --- the counts ---------------------------------------------------------------------------------


def test_tokens_saved_is_the_budget_the_stop_left_unspent() -> None:
    assert tokens_saved(looped(max_tokens=4096)) == 4096 - 600
    assert tokens_saved(record()) == 0
    # continued: a cut request of 1000 tokens, then one of 600 that looped; the turn's usage holds both
    parts = (
        Part(
            reasoning_chars=len(PREFIX), content_chars=0, finish_reason="length", usage=Usage(5, 1000, 1000)
        ),
        Part(
            reasoning_chars=len(LOOP), content_chars=0, finish_reason=FINISH_REASON, usage=Usage(5, 600, 600)
        ),
    )
    continued = replace(looped_turn(completion=1600), parts=parts)
    assert tokens_saved(looped(last=continued, max_tokens=4096)) == 4096 - 1600
    counters = loop_counters([looped(), record(), looped(max_tokens=1000)])
    assert counters == {LOOPED_COUNTER: 2.0, SAVED_COUNTER: float(3496 + 400)}
    assert loop_counters([record()]) == {}
    assert loop_figures({**counters, "check_looping": 2.0}) == {
        "samples": 2,
        "generations": 2,
        "tokens_saved": 3896,
    }
    assert loop_figures({"check_truncated": 3.0}) is None


def test_a_regenerated_loop_counts_as_generated_and_not_trained_under_looping() -> None:
    first = turn()
    old = looped(first)
    new = record(first, turn())  # the round kept turn 1 and sent turn 2 again
    assert superseded(old, new) == (600, 600)
    # the same turn, failed without looping, then sent again: superseded, none of it looping
    unlooped = replace(old.turns[1], loop=None, finish_reason=None, status=RecordStatus.FAILED)
    failed_before = record(first, unlooped)
    assert superseded(failed_before, new) == (600, 0)
    none_looped = Superseded()
    none_looped(failed_before, new)
    assert (none_looped.tokens, none_looped.looping, none_looped.loop_tokens_saved) == (600, 0, 0)
    seen = Superseded()
    seen(old, new)
    assert (seen.tokens, seen.looping, seen.loop_tokens_saved) == (600, 600, 4096 - 600)
    tally = YieldTally()
    tally.add_superseded(seen.tokens + 40, seen.looping)
    assert (tally.generated, tally.superseded, tally.looping) == (640, 40, 600)
    assert tally.to_dict()["where_the_rest_went"]["looping"] == 600
    assert YieldTally.from_counters(tally.counters()).looping == 600


def test_a_replaced_records_superseded_and_looped_tokens_come_from_one_pass_over_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dflash_tasks.core.repair as repair
    from dflash_tasks.core.continuation import carries

    compared: list[int] = []

    def counted(new: Turn, old: Turn) -> bool:
        compared.append(1)
        return carries(new, old)

    monkeypatch.setattr(repair, "carries", counted)
    old = looped(turn(), turn())
    Superseded()(old, record(turn(), turn(), turn()))  # each old turn compared with the new once
    assert len(compared) == len(old.turns) == 3
