"""The output record: one encoding, byte for byte today's lines; reading validates and names the field."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.conversation import can_continue
from dflash_tasks.core.errors import BadRecord, StoreError
from dflash_tasks.core.loss_counts import LossCounts
from dflash_tasks.core.record import Record, Turn, Usage, decode_records, encode_records, outcome_of
from dflash_tasks.core.repetition import FINISH_REASON, Loop
from dflash_tasks.core.states import FailureKind, Outcome, RecordStatus

DATA = Path(__file__).parent / "data"
#: Lines the chunk runner wrote before the record type existed (checked, as stored in a chunk file).
STORED = (DATA / "records-as-stored.jsonl").read_text(encoding="utf-8").splitlines()


def u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def turn(**overrides: Any) -> Turn:
    base = Turn(
        input=(u("q"),),
        reasoning="r",
        content="c",
        finish_reason="stop",
        usage=Usage(5, 40, 30),
        meta_info={"spec_verify_ct": 10},
        status=RecordStatus.OK,
        latency_s=1.5,
        attempts=1,
    )
    return replace(base, **overrides)


def record(*turns: Turn, user_turns: int | None = None) -> Record:
    turns = turns or (turn(),)
    wanted = user_turns or len(turns)
    return Record(
        id="s1",
        line=3,
        user_turns=wanted,
        turns=turns,
        outcome=outcome_of(turns, wanted),
        status=turns[-1].status,
        finish_reason=turns[-1].finish_reason,
        usage=Usage.total(t.usage for t in turns),
        model="m",
        sampling={"max_tokens": 64},
        endpoint="http://e",
        worker="w",
        latency_s=2.0,
        attempts=len(turns),
    )


@pytest.mark.parametrize("line", STORED, ids=["truncated", "failed", "one-turn"])
def test_lines_written_before_the_record_type_read_and_encode_back_byte_for_byte(line: str) -> None:
    r = Record.from_json(line)
    assert r.to_json() == line
    assert r.to_dict() == json.loads(line)  # the same keys, in the same order, with the same values
    assert list(r.to_dict()) == list(json.loads(line))
    assert Record.from_json(r.to_json()) == r


def test_the_stored_lines_read_as_their_fields() -> None:
    truncated, failed, one = (Record.from_json(line) for line in STORED)
    assert (truncated.outcome, truncated.status, truncated.failed_turn) == (
        Outcome.TRUNCATED,
        RecordStatus.OK,
        None,
    )
    assert truncated.turns[0].meta_info is not None and truncated.turns[0].meta_info["spec_verify_ct"] == 10
    assert truncated.usage == Usage(42, 552, 30) and truncated.checks == (
        "no_reasoning",
        "empty_answer",
        "truncated",
    )
    assert (failed.outcome, failed.status, failed.failed_turn) == (Outcome.FAILED, RecordStatus.FAILED, 2)
    assert failed.error == "turn 2 of 2: HTTP 400: prompt too long" and not failed.turns[1].ok
    assert (one.user_turns, len(one.turns), one.outcome) == (1, 1, Outcome.COMPLETE)


def test_round_trip_of_a_built_record_and_of_a_chunk_file() -> None:
    r = record(turn(), turn(finish_reason="length", content=""), user_turns=3)
    assert r.outcome is Outcome.TRUNCATED
    assert Record.from_json(r.to_json()) == r
    checked = replace(r, checks=("truncated",), turns=tuple(replace(t, checks=()) for t in r.turns))
    assert Record.from_json(checked.to_json()) == checked
    data = encode_records([r, checked])
    assert data == (r.to_json() + "\n" + checked.to_json() + "\n").encode()
    assert list(decode_records(b"\n" + data, "outputs/chunk-000000.jsonl")) == [r, checked]


def test_a_failure_says_whether_it_may_pass_and_a_repair_names_its_round() -> None:
    bad = turn(status=RecordStatus.FAILED, content="", finish_reason=None, failure=FailureKind.PERMANENT)
    permanent = replace(record(bad), failure=FailureKind.PERMANENT, failed_turn=1)
    doc = permanent.to_dict()
    assert (doc["failure"], doc["turns"][0]["failure"]) == ("permanent", "permanent")
    assert list(doc).index("failure") == list(doc).index("error") + 1  # written after the error
    assert Record.from_json(permanent.to_json()) == permanent and not permanent.transient
    transient = replace(permanent, failure=FailureKind.TRANSIENT)
    assert transient.transient and Record.from_json(transient.to_json()).failure is FailureKind.TRANSIENT
    repaired = replace(record(), repair=2)
    assert repaired.to_dict()["repair"] == 2 and Record.from_json(repaired.to_json()) == repaired
    assert "failure" not in record().to_dict() and "repair" not in record().to_dict()  # only when set


def test_a_failed_line_from_before_failure_kinds_reads_as_transient() -> None:
    failed = Record.from_json(STORED[1])  # a 400, stored before the field existed
    assert failed.failure is None and failed.transient  # a repair round finds out
    assert not Record.from_json('{"id": "a", "status": "ok"}').transient
    with pytest.raises(BadRecord, match="failure: expected 'permanent' or 'transient', got 'maybe'"):
        Record.from_json('{"id": "a", "failure": "maybe"}')


def test_checks_are_written_only_once_they_ran() -> None:
    r = record()
    assert "checks" not in r.to_dict() and "checks" not in r.to_dict()["turns"][0]
    checked = replace(r, checks=(), turns=(replace(r.turns[0], checks=()),))
    assert list(checked.to_dict())[-1] == "checks" and checked.to_dict()["turns"][0]["checks"] == []


def test_records_from_before_multi_turn_read_as_one_turn() -> None:
    old = {
        "id": "a",
        "messages": [u("q")],
        "reasoning": "r",
        "content": "c",
        "finish_reason": "stop",
        "usage": {"completion_tokens": 5},
        "meta_info": {"spec_verify_ct": 2},
        "status": "ok",
        "checks": [],
    }
    r = Record.from_dict(old)
    (t,) = r.turns
    assert t.input == (u("q"),) and (t.reasoning, t.content) == ("r", "c")
    assert t.usage == Usage(completion_tokens=5) and t.meta_info == {"spec_verify_ct": 2} and t.ok
    assert (r.user_turns, r.outcome, r.failed_turn, r.extra) == (1, Outcome.COMPLETE, None, {})
    new = Record.from_dict({**json.loads(r.to_json()), "user_turns": 3})
    assert new.turns == r.turns and new.user_turns == 3
    assert Record.from_json(r.to_json()) == r  # re-encoded in today's shape, nothing lost


def test_a_line_with_only_an_id_reads_as_a_failed_sample() -> None:
    r = Record.from_json('{"id": "a"}')
    assert (r.status, r.outcome, r.failed_turn, len(r.turns)) == (RecordStatus.FAILED, Outcome.FAILED, 1, 1)


def test_keys_this_code_does_not_know_are_kept_and_written_back_last() -> None:
    doc = json.loads(STORED[2])
    doc["turns"][0]["logprobs"] = [0.5]
    doc = {"id": doc.pop("id"), "shard": 7, **doc}
    r = Record.from_dict(doc)
    assert r.extra == {"shard": 7} and r.turns[0].extra == {"logprobs": [0.5]}
    again = json.loads(r.to_json())
    assert again == doc and list(again)[-1] == "shard" and list(again["turns"][0])[-1] == "logprobs"
    assert Record.from_json(r.to_json()) == r


@pytest.mark.parametrize(
    ("line", "field", "cause"),
    [
        ('{"id": "a", "stat', "", "not JSON"),
        ('{"status": "ok"}', "id", "no id"),
        ("[1, 2]", "id", "no id"),
        ('{"id": 5}', "id", "id: expected a string, got 5"),
        ('{"id": "a", "status": "fine"}', "status", "status: expected 'ok' or 'failed', got 'fine'"),
        ('{"id": "a", "turns": []}', "turns", "turns: expected a non-empty list of turns, got []"),
        (
            '{"id": "a", "turns": [{"status": "ok"}, 3]}',
            "turns[1]",
            "turns[1]: expected a turn object, got 3",
        ),
        (
            '{"id": "a", "turns": [{"status": "ok", "usage": {"completion_tokens": "9"}}]}',
            "turns[0].usage.completion_tokens",
            "turns[0].usage.completion_tokens: expected an integer or null, got '9'",
        ),
        (
            '{"id": "a", "turns": [{"status": "ok", "input": [{"role": "user"}]}]}',
            "turns[0].input[0].content",
            "turns[0].input[0].content: expected a string, got null",
        ),
        (
            '{"id": "a", "outcome": "done"}',
            "outcome",
            "outcome: expected 'complete', 'truncated' or 'failed', got 'done'",
        ),
        ('{"id": "a", "checks": "short"}', "checks", "checks: expected a list of strings, got 'short'"),
        ('{"id": "a", "latency_s": true}', "latency_s", "latency_s: expected a number or null, got true"),
    ],
)
def test_a_malformed_line_raises_an_error_naming_the_field(line: str, field: str, cause: str) -> None:
    with pytest.raises(BadRecord) as caught:
        Record.from_json(line, "outputs/chunk-000001.jsonl:4")
    assert (caught.value.field, caught.value.cause) == (field, cause)
    assert str(caught.value) == f"outputs/chunk-000001.jsonl:4: not a valid output record ({cause})"
    assert isinstance(caught.value, StoreError)  # a damaged store: permanent, never retried


def test_loss_counts_are_written_only_when_counted_and_read_back() -> None:
    r = replace(record(), checks=())
    assert "loss_counts" not in r.to_dict()
    row = (90, 40, 40, 1, 0, 88)
    counted = replace(r, loss_counts=LossCounts("tokenizer=/m;max_length=4096", (row,), (row,)))
    assert list(counted.to_dict())[-2:] == ["checks", "loss_counts"]
    assert counted.to_dict()["loss_counts"]["conversation"] == [[90, 40, 40, 1, 0, 88]]
    assert Record.from_json(counted.to_json()) == counted
    assert Record.from_json(counted.to_json()).to_json() == counted.to_json()


@pytest.mark.parametrize(
    "value",
    [
        '"x"',
        '{"view": 3}',
        '{"view": "v", "conversation": [[1, 2]], "per_turn": []}',
        '{"view": "v", "conversation": [], "per_turn": [[1, 2, 3, 4, 5, -1]]}',
    ],
)
def test_malformed_loss_counts_name_the_field(value: str) -> None:
    with pytest.raises(BadRecord) as caught:
        Record.from_json('{"id": "a", "loss_counts": ' + value + "}", "outputs/chunk-000001.jsonl:4")
    assert caught.value.field == "loss_counts" and caught.value.cause.startswith("loss_counts: expected ")


def test_decoding_a_chunk_names_the_damaged_line() -> None:
    good = record().to_json().encode()
    with pytest.raises(
        BadRecord, match=r"^outputs/chunk-000002.jsonl:3: not a valid output record \(no id\)$"
    ):
        list(decode_records(good + b"\n\n" + b'{"status": "ok"}\n', "outputs/chunk-000002.jsonl"))


def test_a_looped_turn_keeps_where_its_loop_starts_and_reads_back() -> None:
    loop = Loop(start_char=4, start_token=1, period_chars=3, copies=4.0, detected_char=16, detected_token=4)
    looped = turn(reasoning="abcdxyzxyzxyzxyz", content="", finish_reason=FINISH_REASON, loop=loop)
    r = record(looped)
    doc = r.to_dict()["turns"][0]
    assert list(doc)[-2:] == ["attempts", "loop"]
    assert doc["loop"] == {**loop.to_dict(), "text": "reasoning"}
    assert Record.from_json(r.to_json()) == r
    assert looped.looped and looped.before_loop() == ("abcd", "")
    in_answer = replace(
        looped, reasoning="r", content="okxyzxyzxyz", loop=replace(loop, start_char=2, text="content")
    )
    assert in_answer.before_loop() == ("r", "ok")
    assert turn().before_loop() == ("r", "c") and not turn().looped
    assert "loop" not in record(turn()).to_dict()["turns"][0]
    assert outcome_of((in_answer,), 1) is Outcome.TRUNCATED  # an answer, but it looped
    assert not can_continue(in_answer) and can_continue(turn())


def test_a_turn_is_cut_short_at_max_tokens_or_at_its_loop_and_then_ends_its_conversation() -> None:
    loop = Loop(start_char=2, start_token=1, period_chars=3, copies=4.0, detected_char=14, detected_token=4)
    at_loop = turn(content="okxyzxyzxyzxyz", finish_reason=FINISH_REASON, loop=replace(loop, text="content"))
    at_budget = turn(finish_reason="length")
    assert at_loop.cut_short and at_budget.cut_short and not turn().cut_short
    assert not turn(finish_reason=None, status=RecordStatus.FAILED).cut_short
    for cut in (at_loop, at_budget):  # an answer, but cut: the sample is truncated there
        assert outcome_of((cut,), 1) is Outcome.TRUNCATED and not can_continue(cut)


LOOP = (
    '{"start_char": 1, "start_token": 1, "period_chars": 2, "detected_char": 3, "detected_token": 1, '
    '"copies": 2}'
)


@pytest.mark.parametrize(
    ("value", "field", "cause"),
    [
        ('"x"', "turns[0].loop", "turns[0].loop: expected an object or null, got 'x'"),
        (
            LOOP.replace('"start_token": 1', '"start_token": -1'),
            "turns[0].loop.start_token",
            "turns[0].loop.start_token: expected a non-negative integer, got -1",
        ),
        (
            LOOP.replace('"period_chars": 2, ', ""),
            "turns[0].loop.period_chars",
            "turns[0].loop.period_chars: expected a non-negative integer, got null",
        ),
        (
            LOOP.replace('"copies": 2', '"copies": "2"'),
            "turns[0].loop.copies",
            "turns[0].loop.copies: expected a number, got '2'",
        ),
        (
            LOOP.replace("}", ', "text": "answer"}'),
            "turns[0].loop.text",
            "turns[0].loop.text: expected 'reasoning' or 'content', got 'answer'",
        ),
    ],
)
def test_a_malformed_loop_names_the_field(value: str, field: str, cause: str) -> None:
    with pytest.raises(BadRecord) as caught:
        Record.from_json('{"id": "a", "turns": [{"status": "ok", "loop": ' + value + "}]}")
    assert (caught.value.field, caught.value.cause) == (field, cause)
    assert Record.from_json('{"id": "a", "turns": [{"status": "ok", "loop": ' + LOOP + "}]}").turns[0].loop
