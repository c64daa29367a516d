"""Tests for dflash_tasks.producer.inputs: JSONL prompt files into samples or invalid-line reports."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_tasks.core.errors import InputError
from dflash_tasks.core.sample import Sample
from dflash_tasks.producer.inputs import InvalidLine, input_fingerprint, summarize_invalid
from dflash_tasks.producer.mix import read_input

Line = str | bytes | dict[str, Any] | list[Any]


def _encode(line: Line) -> bytes:
    if isinstance(line, bytes):
        return line
    if isinstance(line, str):
        return line.encode()
    return json.dumps(line).encode()


def write(tmp_path: Path, lines: list[Line], name: str = "in.jsonl", *, gz: bool = False) -> Path:
    """Write one line per item, each ending in a newline."""
    data = b"".join(_encode(line) + b"\n" for line in lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def read(path: Path) -> list[Sample | InvalidLine]:
    return list(read_input(path))


def only(tmp_path: Path, line: Line) -> Sample | InvalidLine:
    (item,) = read(write(tmp_path, [line]))
    return item


def sample(tmp_path: Path, line: Line) -> Sample:
    item = only(tmp_path, line)
    assert isinstance(item, Sample), item
    return item


def reason(tmp_path: Path, line: Line) -> str:
    item = only(tmp_path, line)
    assert isinstance(item, InvalidLine), item
    assert item.line == 1
    return item.reason


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# --- accepted shapes ---------------------------------------------------------------------------

SYSTEM_USER = [{"role": "system", "content": "Be brief."}, user("Hi")]

SHAPES: list[tuple[str, dict[str, Any], list[dict[str, str]]]] = [
    ("openai", {"messages": SYSTEM_USER}, SYSTEM_USER),
    (
        "sharegpt",
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}]},
        SYSTEM_USER,
    ),
    ("conversations-role-content", {"conversations": SYSTEM_USER}, SYSTEM_USER),
    ("prompt", {"prompt": "Hi"}, [user("Hi")]),
]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize(("shape", "obj", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_accepted_shapes(
    tmp_path: Path, shape: str, obj: dict[str, Any], expected: list[dict[str, str]], gz: bool
) -> None:
    path = write(tmp_path, [obj, obj | {"id": "second"}], "in.jsonl.gz" if gz else "in.jsonl", gz=gz)
    assert read(path) == [Sample("L1", expected, 1), Sample("second", expected, 2)]


def test_gzip_detected_by_magic_bytes_without_gz_suffix(tmp_path: Path) -> None:
    path = write(tmp_path, [{"prompt": "Hi"}], "prompts.jsonl", gz=True)
    assert read(path) == [Sample("L1", [user("Hi")], 1)]


@pytest.mark.parametrize(
    ("alias", "role"),
    [
        ("human", "user"),
        ("user", "user"),
        ("gpt", "assistant"),
        ("assistant", "assistant"),
        ("chatgpt", "assistant"),
        ("system", "system"),
        ("tool", "tool"),
        ("function", "tool"),
        ("observation", "tool"),
        ("Human", "user"),
    ],
)
def test_sharegpt_role_aliases(tmp_path: Path, alias: str, role: str) -> None:
    turns = [{"from": "human", "value": "Q"}, {"from": alias, "value": "x"}, {"from": "human", "value": "Q2"}]
    got = sample(tmp_path, {"conversations": turns})
    assert got.messages == [user("Q"), {"role": role, "content": "x"}, user("Q2")]


def test_preference_messages_then_conversations_then_prompt(tmp_path: Path) -> None:
    lines: list[Line] = [
        {"prompt": "p", "conversations": [{"from": "human", "value": "c"}], "messages": [user("m")]},
        {"prompt": "p", "conversations": [{"from": "human", "value": "c"}]},
        {"prompt": "p"},
    ]
    assert [s.messages for s in read(write(tmp_path, lines)) if isinstance(s, Sample)] == [
        [user("m")],
        [user("c")],
        [user("p")],
    ]


def test_preferred_key_wins_even_when_it_is_invalid(tmp_path: Path) -> None:
    assert reason(tmp_path, {"messages": None, "prompt": "p"}) == "messages: expected a list, got null"


def test_trailing_assistant_turns_dropped_middle_ones_kept(tmp_path: Path) -> None:
    turns = [
        {"role": "system", "content": "S"},
        user("Q1"),
        {"role": "assistant", "content": "A1"},
        user("Q2"),
        {"role": "assistant", "content": "A2"},
        {"role": "assistant", "content": "A3"},
    ]
    assert sample(tmp_path, {"messages": turns}).messages == turns[:4]


def test_conversation_may_end_with_tool_turn(tmp_path: Path) -> None:
    turns = [user("Q"), {"role": "assistant", "content": "call"}, {"role": "tool", "content": "42"}]
    assert sample(tmp_path, {"messages": turns}).messages == turns


def test_content_kept_as_is_and_extra_keys_ignored(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "  Hi\n\t", "name": "bob"}], "metadata": {"k": 1}}
    got = sample(tmp_path, line)
    assert got.messages == [user("  Hi\n\t")]
    assert set(got.messages[0]) == {"role", "content"}


def test_text_parts_joined_with_newlines(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert sample(tmp_path, {"messages": [{"role": "user", "content": parts}]}).messages == [user("a\nb")]
    assert sample(tmp_path, {"prompt": parts}).messages == [user("a\nb")]
    sharegpt = {"conversations": [{"from": "human", "value": parts}]}
    assert sample(tmp_path, sharegpt).messages == [user("a\nb")]


def test_unicode_and_surrogate_pairs_survive(tmp_path: Path) -> None:
    line = '{"prompt": "caf\\u00e9 \\ud83d\\ude00 \u4e2d"}'
    assert sample(tmp_path, line).messages == [user("caf\u00e9 \U0001f600 \u4e2d")]


def test_utf8_bom_on_first_line_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, [b'\xef\xbb\xbf{"prompt": "Hi"}'])
    assert read(path) == [Sample("L1", [user("Hi")], 1)]


# --- ids ---------------------------------------------------------------------------------------


def test_ids_string_int_absent_null(tmp_path: Path) -> None:
    lines: list[Line] = [
        {"id": "abc", "prompt": "x"},
        {"id": 42, "prompt": "x"},
        {"prompt": "x"},
        {"id": None, "prompt": "x"},
        {"id": -7, "prompt": "x"},
    ]
    assert [s.id for s in read(write(tmp_path, lines)) if isinstance(s, Sample)] == [
        "abc",
        "42",
        "L3",
        "L4",
        "-7",
    ]


def test_duplicate_id_names_first_line(tmp_path: Path) -> None:
    lines: list[Line] = [{"prompt": "x"} for _ in range(6)]
    lines += [{"id": 42, "prompt": "a"}, {"id": "42", "prompt": "b"}]
    items = read(write(tmp_path, lines))
    assert items[6] == Sample("42", [user("a")], 7)
    assert items[7] == InvalidLine(str(tmp_path / "in.jsonl"), 8, "duplicate id '42' (first seen on line 7)")


def test_generated_id_collides_with_later_explicit_id(tmp_path: Path) -> None:
    items = read(write(tmp_path, [{"prompt": "x"}, {"id": "L1", "prompt": "y"}]))
    assert items[0] == Sample("L1", [user("x")], 1)
    assert isinstance(items[1], InvalidLine)
    assert items[1].reason == "duplicate id 'L1' (first seen on line 1)"


def test_explicit_id_collides_with_later_generated_id(tmp_path: Path) -> None:
    items = read(write(tmp_path, [{"id": "L3", "prompt": "x"}, {"prompt": "y"}, {"prompt": "z"}]))
    assert [type(i) for i in items] == [Sample, Sample, InvalidLine]
    assert isinstance(items[2], InvalidLine)
    assert items[2].reason == "duplicate id 'L3' (first seen on line 1)"


def test_lookalike_generated_ids_do_not_collide(tmp_path: Path) -> None:
    lines: list[Line] = [{"prompt": "x"}, {"id": "L01", "prompt": "y"}, {"id": "l1", "prompt": "z"}]
    assert [i.id for i in read(write(tmp_path, lines)) if isinstance(i, Sample)] == ["L1", "L01", "l1"]


def test_invalid_lines_do_not_claim_ids(tmp_path: Path) -> None:
    lines: list[Line] = [
        {"id": 7, "prompt": " "},
        {"id": 7, "prompt": "ok"},
        {"prompt": ""},
        {"id": "L3", "prompt": "k"},
    ]
    items = read(write(tmp_path, lines))
    assert [type(i) for i in items] == [InvalidLine, Sample, InvalidLine, Sample]


@pytest.mark.parametrize(
    ("value", "got"), [([1], "list"), ({"a": 1}, "dict"), (1.5, "float"), (True, "bool"), (False, "bool")]
)
def test_id_of_wrong_type_is_invalid(tmp_path: Path, value: Any, got: str) -> None:
    assert reason(tmp_path, {"id": value, "prompt": "x"}) == f"id: expected a string or integer, got {got}"


def test_empty_string_id_is_invalid(tmp_path: Path) -> None:
    assert reason(tmp_path, {"id": "", "prompt": "x"}) == "id: expected a non-empty string"


# --- invalid lines -----------------------------------------------------------------------------

NO_USER_TEXT = "empty prompt: no user message with text"

BAD_LINES: list[tuple[str, Line, str]] = [
    ("malformed-json", '{"prompt": "x" "id": 1}', "malformed JSON: Expecting ',' delimiter at column 16"),
    ("truncated-json", '{"prompt": "x"', "malformed JSON: Expecting ',' delimiter at end of line"),
    ("not-json", "hello", "malformed JSON: Expecting value at column 1"),
    (
        "huge-int",
        '{"prompt": "x", "n": ' + "9" * 5000 + "}",
        "malformed JSON: Exceeds the limit (4300 digits)",
    ),
    ("array", [1, 2], "expected a JSON object, got list"),
    ("number", "3", "expected a JSON object, got int"),
    ("string", '"hi"', "expected a JSON object, got str"),
    ("null", "null", "expected a JSON object, got null"),
    (
        "unknown-shape",
        {"text": "hi", "foo": 1},
        "unknown shape: expected one of 'messages', 'conversations', 'prompt' (found keys: 'text', 'foo')",
    ),
    (
        "empty-object",
        {},
        "unknown shape: expected one of 'messages', 'conversations', 'prompt' (found keys: none)",
    ),
    ("empty-prompt", {"prompt": ""}, NO_USER_TEXT),
    ("whitespace-prompt", {"prompt": " \t\n\u3000"}, NO_USER_TEXT),
    ("empty-messages", {"messages": []}, NO_USER_TEXT),
    ("whitespace-user", {"messages": [user("   "), user("\n")]}, NO_USER_TEXT),
    ("only-assistant", {"messages": [{"role": "assistant", "content": "A"}]}, NO_USER_TEXT),
    (
        "only-gpt",
        {"conversations": [{"from": "gpt", "value": "A"}, {"from": "gpt", "value": "B"}]},
        NO_USER_TEXT,
    ),
    ("only-system", {"messages": [{"role": "system", "content": "S"}]}, NO_USER_TEXT),
    (
        "ends-with-system",
        {"messages": [user("Q"), {"role": "system", "content": "S"}]},
        "empty prompt: the conversation ends with a system turn, not a user or tool turn",
    ),
    (
        "unknown-from",
        {
            "conversations": [
                {"from": "human", "value": "a"},
                {"from": "gpt", "value": "b"},
                {"from": "bot", "value": "c"},
            ]
        },
        "conversations[2].from: unknown role 'bot'",
    ),
    (
        "unknown-role",
        {"messages": [{"role": "bing", "content": "x"}]},
        "messages[0].role: unknown role 'bing'",
    ),
    (
        "role-not-str",
        {"messages": [{"role": 1, "content": "x"}]},
        "messages[0].role: expected a string, got int",
    ),
    ("missing-role", {"messages": [{"content": "x"}]}, "messages[0]: missing 'role' (or ShareGPT 'from')"),
    ("missing-content", {"messages": [{"role": "user"}]}, "messages[0]: missing 'content'"),
    ("missing-value", {"conversations": [{"from": "human"}]}, "conversations[0]: missing 'value'"),
    ("turn-not-object", {"messages": [user("x"), "hi"]}, "messages[1]: expected an object, got str"),
    ("messages-not-list", {"messages": {"role": "user"}}, "messages: expected a list, got dict"),
    ("conversations-not-list", {"conversations": "hi"}, "conversations: expected a list, got str"),
    (
        "content-int",
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content: expected a string or a list of text parts, got int",
    ),
    (
        "content-null",
        {"messages": [{"role": "user", "content": None}]},
        "messages[0].content: expected a string or a list of text parts, got null",
    ),
    (
        "value-dict",
        {"conversations": [{"from": "human", "value": {"a": 1}}]},
        "conversations[0].value: expected a string or a list of text parts, got dict",
    ),
    ("prompt-int", {"prompt": 3}, "prompt: expected a string or a list of text parts, got int"),
    (
        "non-text-part",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
        "messages[0].content[1]: unsupported part type 'image_url' (only 'text' parts are accepted)",
    ),
    (
        "part-without-type",
        {"messages": [{"role": "user", "content": [{"text": "a"}]}]},
        "messages[0].content[0]: unsupported part type null (only 'text' parts are accepted)",
    ),
    (
        "part-not-object",
        {"messages": [{"role": "user", "content": ["a"]}]},
        "messages[0].content[0]: expected a text part object, got str",
    ),
    (
        "part-text-not-str",
        {"prompt": [{"type": "text", "text": 1}]},
        "prompt[0].text: expected a string, got int",
    ),
    (
        "lone-surrogate",
        '{"prompt": "bad \\ud800 escape"}',
        "message 0: text contains a lone surrogate escape, not encodable as UTF-8",
    ),
    ("invalid-utf8", b'{"prompt": "caf\xe9"}', "invalid UTF-8 at byte 15"),
    ("invalid-utf8-start", b"\xff\xfe{}", "invalid UTF-8 at byte 0"),
    ("encoded-surrogate", b'{"prompt": "\xed\xa0\x80"}', "invalid UTF-8 at byte 12"),
    ("blank", "", "blank line"),
    ("whitespace", " \t\r", "blank line"),
    ("nested-array", "[" * 100_000, "malformed JSON: nesting too deep"),
    ("nested-object", '{"prompt": "x", "m": ' + '{"a":' * 100_000, "malformed JSON: nesting too deep"),
]


@pytest.mark.parametrize(("line", "expected"), [b[1:] for b in BAD_LINES], ids=[b[0] for b in BAD_LINES])
def test_bad_line_reason(tmp_path: Path, line: Line, expected: str) -> None:
    assert reason(tmp_path, line).startswith(expected)
    assert len(reason(tmp_path, line)) < 200


def test_invalid_line_names_file_as_given(tmp_path: Path) -> None:
    path = write(tmp_path, ["nope"])
    (item,) = list(read_input(str(path)))
    assert isinstance(item, InvalidLine)
    assert item.file == str(path)


def test_long_values_are_truncated_in_reasons(tmp_path: Path) -> None:
    got = reason(tmp_path, {"messages": [{"role": "r" * 10_000, "content": "x"}]})
    assert got == "messages[0].role: unknown role '" + "r" * 40 + "'..."


# --- line accounting ---------------------------------------------------------------------------

MIXED: list[Line] = [
    {"prompt": "one"},
    "",
    "{broken",
    {"messages": [user("four"), {"role": "assistant", "content": "A"}]},
    b"\xc3\x28",
    [1],
    {"conversations": [{"from": "human", "value": "seven"}]},
    "   ",
    {"id": "L1", "prompt": "dup"},
    {"prompt": "ten"},
]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_every_line_reported_once_in_order(tmp_path: Path, gz: bool) -> None:
    items = read(write(tmp_path, MIXED, "in.jsonl.gz" if gz else "in.jsonl", gz=gz))
    assert [i.line for i in items] == list(range(1, len(MIXED) + 1))
    valid = [i.line for i in items if isinstance(i, Sample)]
    invalid = [i.line for i in items if isinstance(i, InvalidLine)]
    assert valid == [1, 4, 7, 10]
    assert invalid == [2, 3, 5, 6, 8, 9]
    assert len(valid) + len(invalid) == len(MIXED)
    assert [i.id for i in items if isinstance(i, Sample)] == ["L1", "L4", "L7", "L10"]


def test_trailing_newline_adds_no_line_but_missing_one_loses_none(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "b"}\n')
    assert [i.line for i in read(path)] == [1, 2]
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "b"}')
    assert read(path)[-1] == Sample("L2", [user("b")], 2)
    path.write_bytes(b'{"prompt": "a"}\n\n')
    assert read(path)[1] == InvalidLine(str(path), 2, "blank line")


def test_crlf_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\r\n{"prompt": "b"}\r\n')
    items = read(path)
    assert items == [
        Sample("L1", [user("a")], 1),
        InvalidLine(str(path), 2, "blank line"),
        Sample("L3", [user("b")], 3),
    ]


def test_empty_files_yield_nothing(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress(b""))
    assert read(tmp_path / "e.jsonl") == []
    assert read(tmp_path / "e.jsonl.gz") == []


def test_very_long_line(tmp_path: Path) -> None:
    text = "x" * (20 << 20)
    path = write(tmp_path, [{"prompt": text}, {"prompt": "after"}])
    items = read(path)
    assert isinstance(items[0], Sample)
    assert items[0].messages[0]["content"] == text
    assert items[1] == Sample("L2", [user("after")], 2)


def test_returns_a_lazy_iterator(tmp_path: Path) -> None:
    path = write(tmp_path, [{"prompt": "a"}, "{bad", {"prompt": "c"}])
    it = read_input(path)
    assert iter(it) is it
    assert next(it) == Sample("L1", [user("a")], 1)
    assert isinstance(next(it), InvalidLine)
    assert next(it) == Sample("L3", [user("c")], 3)
    with pytest.raises(StopIteration):
        next(it)


# --- unreadable inputs -------------------------------------------------------------------------


def test_missing_file_raises_at_call_time(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(InputError, match=r"nope\.jsonl: input file not found"):
        read_input(missing)
    with pytest.raises(InputError, match="not found"):
        input_fingerprint(missing)


def test_a_directory_is_a_folder_source_and_no_file_to_fingerprint(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"the folder holds no \.jsonl, \.parquet or \.arrow file"):
        read_input(tmp_path)
    with pytest.raises(InputError, match="is a directory"):
        input_fingerprint(tmp_path)


@pytest.mark.parametrize(
    "data",
    [
        b"\x1f\x8b" + b"garbage" * 10,
        b'{"prompt": "plain text named .gz"}\n',
        gzip.compress(b"x" * 1000)[:-8] + b"\0" * 8,
    ],
    ids=["bad-header", "not-gzip", "bad-crc"],
)
def test_corrupt_gzip_raises(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(InputError, match=r"bad\.jsonl\.gz: gzip stream is corrupt or truncated"):
        read(path)


def test_truncated_gzip_keeps_yielded_lines_then_raises(tmp_path: Path) -> None:
    path = write(
        tmp_path, [{"prompt": f"line {i} " + "pad " * 20} for i in range(5000)], "t.jsonl.gz", gz=True
    )
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    seen: list[Sample | InvalidLine] = []
    with pytest.raises(InputError) as info:
        seen.extend(read_input(path))
    assert 0 < len(seen) < 5000
    assert all(isinstance(i, Sample) for i in seen)
    assert [i.line for i in seen] == list(range(1, len(seen) + 1))
    assert f"after line {len(seen)}:" in str(info.value)
    assert "t.jsonl.gz" in str(info.value)


# --- fingerprint -------------------------------------------------------------------------------


def test_fingerprint_is_sha256_of_raw_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    data = b'{"prompt": "x"}\n' * 150_000  # > 2 MiB: several blocks
    path.write_bytes(data)
    expected = "sha256:" + hashlib.sha256(data).hexdigest()
    assert input_fingerprint(path) == expected
    assert input_fingerprint(str(path)) == expected
    path.write_bytes(data + b"\n")
    assert input_fingerprint(path) != expected


def test_fingerprint_of_gzip_is_of_compressed_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, [{"prompt": "x"}], "f.jsonl.gz", gz=True)
    assert input_fingerprint(path) == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# --- summary -----------------------------------------------------------------------------------


def test_summarize_invalid() -> None:
    items = [InvalidLine("in.jsonl", n, f"reason {n}") for n in range(1, 6)]
    assert summarize_invalid(iter(items), limit=2) == (
        "5 invalid lines\nin.jsonl:1: reason 1\nin.jsonl:2: reason 2\n... and 3 more"
    )
    assert summarize_invalid(items[:1]) == "1 invalid line\nin.jsonl:1: reason 1"
    assert summarize_invalid([]) == "0 invalid lines"
    assert summarize_invalid(items, limit=0) == "5 invalid lines\n... and 5 more"
    assert summarize_invalid(items, limit=5).splitlines()[-1] == "in.jsonl:5: reason 5"


def test_summarize_real_file(tmp_path: Path) -> None:
    path = write(tmp_path, ["", {"prompt": "ok"}, "[]"])
    invalid = [i for i in read_input(path) if isinstance(i, InvalidLine)]
    assert summarize_invalid(invalid) == (
        f"2 invalid lines\n{path}:1: blank line\n{path}:3: expected a JSON object, got list"
    )


# --- properties --------------------------------------------------------------------------------

RAW_LINES = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=RAW_LINES, gz=st.booleans())
def test_random_bytes_never_raise(tmp_path: Path, lines: list[bytes], gz: bool) -> None:
    data = b"".join(line + b"\n" for line in lines)
    path = tmp_path / ("r.jsonl.gz" if gz else "r.jsonl")
    magics = (b"\x1f\x8b", b"PAR1", b"ARROW1", b"\xff\xff\xff\xff", b"PK\x03\x04", b"\x28\xb5\x2f\xfd")
    while not gz and data.startswith(magics):  # a file of another format's magic bytes is refused whole
        data = b"x" + data[1:]
    path.write_bytes(gzip.compress(data) if gz else data)
    items = read(path)
    assert [i.line for i in items] == list(range(1, len(lines) + 1))
    assert all(isinstance(i, Sample | InvalidLine) for i in items)


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
TEXTS = st.text(max_size=6) | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=4)}),
    max_size=2,
)
TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "gpt", "bot"]), "content": TEXTS | JSON}
) | st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "system", "x"]), "value": TEXTS})
OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "id": st.integers(0, 3) | st.sampled_from(["L1", "L2", "a"]) | JSON,
        "messages": st.lists(TURN, max_size=4) | JSON,
        "conversations": st.lists(TURN, max_size=4),
        "prompt": TEXTS | JSON,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(objs=st.lists(OBJECTS | JSON, max_size=8))
def test_random_json_lines_classified_consistently(tmp_path: Path, objs: list[Any]) -> None:
    path = write(tmp_path, [json.dumps(o) for o in objs], "j.jsonl")
    items = read(path)
    assert [i.line for i in items] == list(range(1, len(objs) + 1))
    ids = [i.id for i in items if isinstance(i, Sample)]
    assert len(ids) == len(set(ids))
    for item in items:
        if isinstance(item, Sample):
            roles = [m["role"] for m in item.messages]
            assert roles[-1] in ("user", "tool")
            assert set(roles) <= {"system", "user", "assistant", "tool"}
            assert any(m["role"] == "user" and m["content"].strip() for m in item.messages)
        else:
            assert item.reason


# --- edges found by mutation testing (make mutate) ------------------------------------------------


def test_summarize_shows_ten_by_default() -> None:
    items = [InvalidLine("in.jsonl", n, "r") for n in range(1, 13)]
    assert summarize_invalid(items).splitlines()[-2:] == ["in.jsonl:10: r", "... and 2 more"]


def test_corrupt_gzip_header_fails_before_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(InputError, match=r"gzip stream is corrupt or truncated before the first line: "):
        read(path)


def test_a_path_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    import socket

    sock_path = tmp_path / "s.jsonl"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))  # exists, but no file to read
        with pytest.raises(InputError, match=f"^{sock_path}: cannot open input file: "):
            read(sock_path)
        with pytest.raises(InputError, match=f"^{sock_path}: cannot read input file: "):
            input_fingerprint(sock_path)
    long = tmp_path / ("x" * 300)
    with pytest.raises(InputError, match=f"^{long}: cannot access input file: "):
        read(long)


def test_json_cut_off_at_the_end_of_the_file_says_end_of_line(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b'{"prompt": "x"')  # no newline after it
    (item,) = read(path)
    assert isinstance(item, InvalidLine)
    assert item.reason == "malformed JSON: Expecting ',' delimiter at end of line"


def test_an_id_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    assert reason(tmp_path, '{"id": "a\\udc80", "prompt": "x"}') == (
        "id: contains a lone surrogate escape, not encodable as UTF-8"
    )


def test_a_part_type_that_is_not_a_string_is_named_by_its_type(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]}
    assert "unsupported part type int (only 'text' parts are accepted)" in reason(tmp_path, line)


def test_ids_are_quoted_whole_up_to_forty_characters(tmp_path: Path) -> None:
    forty, longer = "i" * 40, "j" * 41
    items = read(write(tmp_path, [{"id": i, "prompt": "x"} for i in (forty, forty, longer, longer)]))
    reasons = [i.reason for i in items if isinstance(i, InvalidLine)]
    assert reasons == [
        f"duplicate id '{forty}' (first seen on line 1)",
        f"duplicate id '{'j' * 40}'... (first seen on line 3)",
    ]


def test_unknown_shapes_list_up_to_eight_keys(tmp_path: Path) -> None:
    eight = {k: 1 for k in "abcdefgh"}
    assert reason(tmp_path, eight).endswith("(found keys: 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h')")
    assert reason(tmp_path, {**eight, "i": 1}).endswith("'f', 'g', 'h', ...)")


def test_generated_ids_past_the_first_block_of_lines(tmp_path: Path) -> None:
    """Generated ids are tracked in blocks of 4096 lines: ids at and past a block's end."""
    lines: list[Line] = [{"prompt": "x"} for _ in range(4097)]  # L4096 lands on the block's end
    lines += [{"id": "L4097", "prompt": "y"}, {"id": "L8192", "prompt": "z"}]
    items = read(write(tmp_path, lines))
    assert all(isinstance(i, Sample) for i in items[:4097]) and items[4096].id == "L4097"
    assert isinstance(items[4097], InvalidLine) and "first seen on line 4097" in items[4097].reason
    assert isinstance(items[4098], Sample)  # just past what is tracked: not a generated id


def test_a_first_generated_id_far_down_the_file(tmp_path: Path) -> None:
    lines: list[Line] = [{"id": f"e{i}", "prompt": "x"} for i in range(9999)] + [{"prompt": "late"}]
    lines.append({"id": "L10000", "prompt": "clash"})
    items = read(write(tmp_path, lines))
    assert items[9999] == Sample("L10000", [user("late")], 10000)
    assert isinstance(items[10000], InvalidLine) and "first seen on line 10000" in items[10000].reason


def test_a_number_too_long_to_convert_is_malformed_json_without_the_details(tmp_path: Path) -> None:
    line = '{"prompt": "x", "n": ' + "1" * 5000 + "}"
    assert (
        reason(tmp_path, line)
        == "malformed JSON: Exceeds the limit (4300 digits) for integer string conversion"
    )
