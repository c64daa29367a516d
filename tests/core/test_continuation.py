"""Continuing a cut thought: which turns are continued, with what budget, and the record of both parts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dflash_tasks.core.continuation import (
    THOUGHT_OPENER,
    continuation_budget,
    is_cut_thought,
    joined,
    new_parts,
    opener_for,
    prefix_message,
)
from dflash_tasks.core.errors import BadRecord
from dflash_tasks.core.record import Record, Usage, outcome_of
from dflash_tasks.core.repair import needs_repair, to_continue
from dflash_tasks.core.repetition import Loop
from dflash_tasks.core.spec_stats import spec_counts
from tests.core.test_record import STORED, record, turn

HORIZON = 4096


def cut(prompt: int = 100, done: int = 1000) -> Record:
    """A one-turn record whose thought stopped at ``max_tokens`` = ``done``."""
    return record(
        turn(reasoning="Okay let me", content="", finish_reason="length", usage=Usage(prompt, done, done))
    )


def continued(old: Record, added: int = 500) -> Record:
    t = joined(
        old.turns[-1],
        " think about it",
        "The answer.",
        "stop",
        Usage(old.usage.prompt_tokens + 7, added, added - 3),
        {"spec_verify_ct": 100},
        2.0,
        1,
    )
    return replace(old, turns=(t,), outcome=outcome_of((t,), 1), finish_reason="stop", usage=t.usage)


def test_only_a_thought_cut_short_of_the_horizon_is_continued_up_to_it() -> None:
    assert is_cut_thought(cut().turns[0])
    assert continuation_budget(cut().turns[0], HORIZON) == HORIZON - 100 - 1000
    assert continuation_budget(cut(100, 3996).turns[0], HORIZON) == 0  # the trainer cuts it there anyway
    assert continuation_budget(cut().turns[0], HORIZON, max_tokens=3000) == 2000  # --repair-truncated
    answered = replace(cut().turns[0], content="partial answer")  # cut in its answer: not a thought
    assert not is_cut_thought(answered) and continuation_budget(answered, HORIZON) == 0
    assert not is_cut_thought(turn())  # finished


def test_a_repair_round_continues_cut_thoughts_and_regenerates_none_of_them() -> None:
    assert needs_repair(cut(), horizon=HORIZON) and to_continue(cut(), None, HORIZON) == 2996
    assert not needs_repair(cut(100, 3996), horizon=HORIZON)
    assert not needs_repair(cut())  # no horizon and no amendment: kept as it is
    # --repair-truncated --max-tokens 1000: the thought already has 1000 tokens, it is not regenerated
    assert not needs_repair(cut(), max_tokens=1000)
    assert needs_repair(cut(), max_tokens=1500) and to_continue(cut(), 1500, None) == 500


def test_the_opener_follows_the_templates_generation_prompt() -> None:
    assert opener_for("<|im_start|>assistant\n") == THOUGHT_OPENER  # Qwen3: the model writes it
    assert opener_for("<|im_start|>assistant\n<think>\n") == ""  # Qwen3.5/3.6: the template does
    assert prefix_message(cut().turns[0], THOUGHT_OPENER) == {
        "role": "assistant",
        "content": "<think>\nOkay let me",
    }


def test_a_continued_turn_is_one_turn_that_keeps_both_parts_and_reads_back() -> None:
    old = cut()
    new = continued(old)
    t = new.turns[0]
    assert (t.reasoning, t.content, t.finish_reason) == ("Okay let me think about it", "The answer.", "stop")
    assert t.usage == Usage(100, 1500, 1497)  # the row's prompt, every generated token
    assert t.part_texts() == [("Okay let me", ""), (" think about it", "The answer.")]
    assert [p.usage.completion_tokens for p in t.parts] == [1000, 500]
    assert new_parts(old.turns[0], t) == t.parts[1:]
    assert Record.from_json(new.to_json()) == new
    doc = json.loads(new.to_json())
    assert list(doc["turns"][0])[-2:] == ["attempts", "parts"]  # parts after attempts, before checks
    assert not is_cut_thought(t) and not needs_repair(new, horizon=HORIZON)


def test_records_without_parts_are_written_as_before() -> None:
    assert all(Record.from_json(line).to_json() == line for line in STORED)
    assert "parts" not in json.loads(cut().to_json())["turns"][0]


def test_parts_that_do_not_add_up_to_the_text_are_refused() -> None:
    doc = json.loads(continued(cut()).to_json())
    doc["turns"][0]["parts"][1]["reasoning_chars"] += 1
    with pytest.raises(BadRecord, match=r"turns\[0\]\.parts"):
        Record.from_json(json.dumps(doc))


def test_speculative_counts_of_a_continued_turn_add_each_requests_own() -> None:
    old = cut()
    first = replace(old.turns[0], meta_info={"spec_verify_ct": 400})
    new = continued(replace(old, turns=(first,)))
    assert spec_counts(new) == (1500, 500)


@pytest.mark.parametrize("budget", [0, -5])
def test_nothing_to_continue_past_the_horizon(budget: int) -> None:
    done = HORIZON - 100 - budget
    assert continuation_budget(cut(100, done).turns[0], HORIZON) == 0


def test_a_thought_cut_under_the_horizon_budget_is_never_continued() -> None:
    """Its request was given the trainer's horizon counted on the row as the trainer renders it
    (its template's system prompt included), which the server's prompt tokens can fall short of."""
    generated = replace(cut(100, 1000), sampling={"max_tokens": HORIZON, "budget_policy": "horizon"})
    assert continuation_budget(generated.turns[0], HORIZON) == 2996  # by the server's prompt tokens
    assert not needs_repair(generated, horizon=HORIZON) and to_continue(generated, None, HORIZON) == 0
    assert to_continue(replace(generated, sampling={"max_tokens": HORIZON}), None, HORIZON) == 2996


def test_a_continued_loop_is_placed_in_the_joined_turn_and_never_before_its_start() -> None:
    cut = turn(reasoning="x" * 117, content="", finish_reason="length", usage=Usage(5, 30, 30))
    usage = Usage(5, 40, 40)
    in_thought = Loop(
        start_char=-20, start_token=-5, period_chars=9, copies=3.0, detected_char=60, detected_token=15
    )
    t = joined(cut, "y" * 60, "", "stop", usage, None, 0.1, 1, in_thought)
    assert t.loop is not None and (t.loop.start_char, t.loop.start_token) == (97, 25)
    # a run reaching back past the thought's first character (into the opener): clamped to 0
    from_start = replace(in_thought, start_char=-118, start_token=-31)
    t = joined(cut, "y" * 60, "", "stop", usage, None, 0.1, 1, from_start)
    assert t.loop is not None and (t.loop.start_char, t.loop.start_token) == (0, 0)
    record_turn = Record.from_json(json.dumps({"id": "a", "turns": [t.to_dict()]})).turns[0]
    assert record_turn.loop == t.loop  # stored and read back
    in_answer = replace(in_thought, start_char=3, start_token=1, text="content")
    answered = replace(cut, content="ab")
    t = joined(answered, "", "z" * 30, "stop", usage, None, 0.1, 1, in_answer)
    assert t.loop is not None and t.loop.start_char == 5
