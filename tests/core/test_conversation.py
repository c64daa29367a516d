"""How a conversation splits into turns, what each turn's request carries, and when it ends."""

from __future__ import annotations

from dataclasses import replace

from dflash_tasks.core.conversation import (
    blank_answers,
    can_continue,
    count_turns,
    request_messages,
    turn_inputs,
)
from dflash_tasks.core.record import Turn
from dflash_tasks.core.states import RecordStatus

SYS = {"role": "system", "content": "Be brief."}


def u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_each_user_turn_is_one_turn_and_old_answers_only_mark_the_ends() -> None:
    messages = [SYS, u("q1"), a("OLD 1"), u("q2"), a("OLD 2"), u("q3")]
    assert turn_inputs(messages, "all") == [[SYS, u("q1")], [u("q2")], [u("q3")]]
    assert count_turns(messages, "all") == 3
    assert turn_inputs([u("only")], "all") == [[u("only")]]


def test_turns_last_sends_the_source_history_as_one_turn() -> None:
    messages = [SYS, u("q1"), a("OLD 1"), u("q2")]
    assert turn_inputs(messages, "last") == [messages] and count_turns(messages, "last") == 1


def test_leading_and_repeated_assistant_messages_mark_nothing_more() -> None:
    messages = [a("hello!"), u("q1"), a("x"), a("y"), u("q2"), {"role": "tool", "content": "42"}]
    assert turn_inputs(messages, "all") == [[u("q1")], [u("q2"), {"role": "tool", "content": "42"}]]


def test_staged_answers_are_blank_and_split_the_same() -> None:
    messages = [SYS, u("q1"), a("OLD 1"), u("q2")]
    blank = blank_answers(messages)
    assert blank == [SYS, u("q1"), a(""), u("q2")]
    assert turn_inputs(blank, "all") == turn_inputs(messages, "all")
    assert "OLD" not in str(blank)


def test_each_request_carries_the_models_own_earlier_answers_as_text() -> None:
    inputs = [[SYS, u("q1")], [u("q2")], [u("q3")]]
    assert request_messages(inputs, []) == [SYS, u("q1")]
    assert request_messages(inputs, ["mine 1", "mine 2"]) == [
        SYS,
        u("q1"),
        a("mine 1"),
        u("q2"),
        a("mine 2"),
        u("q3"),
    ]


def test_a_turn_that_failed_was_truncated_or_has_no_answer_ends_the_conversation() -> None:
    good = Turn(status=RecordStatus.OK, finish_reason="stop", content="42")
    assert can_continue(good)
    assert not can_continue(replace(good, status=RecordStatus.FAILED))
    assert not can_continue(replace(good, finish_reason="length"))
    assert not can_continue(replace(good, content="  "))


def test_history_reasoning_keep_sends_each_answer_with_its_reasoning() -> None:
    from dflash_tasks.core.conversation import request_messages

    inputs = [[{"role": "user", "content": "u1"}], [{"role": "user", "content": "u2"}]]
    assert request_messages(inputs, ["a1"])[1] == {"role": "assistant", "content": "a1"}
    kept = request_messages(inputs, ["a1"], ["r1"])
    assert kept == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "u2"},
    ]
