"""Tests for dflash_tasks.producer.staging: chunk files, invalid.jsonl and the manifest in a LocalStore."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import InputError
from dflash_tasks.core.job import INVALID_KEY, MANIFEST_KEY, Manifest, input_key
from dflash_tasks.core.sample import Sample, decode_chunk, encode_sample
from dflash_tasks.producer.inputs import InvalidLine
from dflash_tasks.producer.staging import NoValidSample, chunked, read_invalid, stage_input
from dflash_tasks.store import LocalStore
from dflash_tasks.store.jobfiles import load_manifest

JOB = "0123456789abcdef"


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def write_input(path: Path, lines: list[str | dict[str, Any]]) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text)
    return path


def all_files(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    """12 lines: 10 valid prompts, a malformed line at 4 and a duplicate id at 9."""
    lines: list[str | dict[str, Any]] = []
    for i in range(1, 13):
        if i == 4:
            lines.append('{"messages": [')
        elif i == 9:
            lines.append({"id": "p1", "prompt": "duplicate id"})
        else:
            lines.append({"id": f"p{i}", "messages": user(f"question {i}")})
    return write_input(tmp_path / "prompts.jsonl", lines)


def test_stage_input_writes_chunks_invalid_and_manifest(tmp_path: Path, prompts: Path) -> None:
    store = LocalStore(tmp_path / "out")
    report = stage_input(prompts, store, JOB, chunk_size=3)
    expected = Manifest(job_id=JOB, lines=12, samples=10, invalid=2, chunk_size=3, chunks=4)
    assert report.manifest == expected
    assert load_manifest(store) == expected

    chunks = [decode_chunk(store.read(input_key(c))) for c in range(4)]
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert [expected.chunk_samples(c) for c in range(4)] == [3, 3, 3, 1]
    ids = [s.id for chunk in chunks for s in chunk]
    assert ids == ["p1", "p2", "p3", "p5", "p6", "p7", "p8", "p10", "p11", "p12"]
    assert [s.line for chunk in chunks for s in chunk] == [1, 2, 3, 5, 6, 7, 8, 10, 11, 12]
    assert chunks[1][0] == Sample(id="p5", messages=user("question 5"), line=5)
    assert not store.exists(input_key(4))

    invalid = read_invalid(store)
    assert [(d["line"], d["file"]) for d in invalid] == [(4, str(prompts)), (9, str(prompts))]
    assert "malformed JSON" in str(invalid[0]["reason"])
    assert invalid[1]["reason"] == "duplicate id 'p1' (first seen on line 1)"
    assert [(b.line, b.reason) for b in report.invalid] == [(d["line"], d["reason"]) for d in invalid]

    files = all_files(tmp_path / "out")
    assert sorted(files) == [
        "inputs/chunk-000000.jsonl",
        "inputs/chunk-000001.jsonl",
        "inputs/chunk-000002.jsonl",
        "inputs/chunk-000003.jsonl",
        "invalid.jsonl",
        "manifest.json",
    ]
    # Every chunk file is JSON lines, newline-terminated.
    for name, data in files.items():
        if name.startswith("inputs/"):
            assert data.endswith(b"\n")
            assert all(json.loads(line) for line in data.splitlines())


def test_samples_plus_invalid_equals_lines(tmp_path: Path) -> None:
    lines: list[str | dict[str, Any]] = []
    for i in range(100):
        lines.append("" if i % 7 == 6 else {"prompt": f"q{i}"})
    path = write_input(tmp_path / "p.jsonl", lines)
    store = LocalStore(tmp_path / "out")
    m = stage_input(path, store, JOB, chunk_size=16).manifest
    assert m.samples + m.invalid == m.lines == 100
    assert m.chunks == 6  # ceil(86 / 16)
    total = sum(len(decode_chunk(store.read(input_key(c)))) for c in range(m.chunks))
    assert total == m.samples == 86
    assert len(read_invalid(store)) == m.invalid == 14


def test_last_line_invalid_counts_in_lines(tmp_path: Path) -> None:
    path = write_input(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}, "[1]", "nope"])
    m = stage_input(path, LocalStore(tmp_path / "out"), JOB, chunk_size=64).manifest
    assert (m.lines, m.samples, m.invalid, m.chunks) == (4, 2, 2, 1)


def test_exact_multiple_of_chunk_size(tmp_path: Path) -> None:
    path = write_input(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(8)])
    store = LocalStore(tmp_path / "out")
    m = stage_input(path, store, JOB, chunk_size=4).manifest
    assert m.chunks == 2
    assert [len(decode_chunk(store.read(input_key(c)))) for c in range(2)] == [4, 4]
    assert store.read(INVALID_KEY) == b""
    assert read_invalid(store) == []


def test_all_invalid_input_is_refused_naming_the_lines(tmp_path: Path) -> None:
    path = write_input(tmp_path / "p.jsonl", ["x", "y", ""])
    store = LocalStore(tmp_path / "out")
    with pytest.raises(
        NoValidSample, match=r"no valid sample in the input: 3 invalid lines\n.*p.jsonl:1: malformed"
    ):
        stage_input(path, store, JOB, chunk_size=4)
    assert list(store.list("inputs/")) == []
    assert not store.exists(MANIFEST_KEY)


def test_empty_input_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(NoValidSample, match="no valid sample in the input: it holds no rows"):
        stage_input(path, LocalStore(tmp_path / "out"), JOB, chunk_size=4)


def test_gzip_input_stages_like_plain(tmp_path: Path, prompts: Path) -> None:
    gz = tmp_path / "prompts.jsonl.gz"
    gz.write_bytes(gzip.compress(prompts.read_bytes()))
    plain = stage_input(prompts, LocalStore(tmp_path / "a"), JOB, chunk_size=3)
    packed = stage_input(gz, LocalStore(tmp_path / "b"), JOB, chunk_size=3)
    assert plain.manifest == packed.manifest
    a, b = all_files(tmp_path / "a"), all_files(tmp_path / "b")
    assert {k: v for k, v in a.items() if k != INVALID_KEY} == {
        k: v for k, v in b.items() if k != INVALID_KEY
    }


def test_dry_run_writes_nothing(tmp_path: Path, prompts: Path) -> None:
    before = all_files(tmp_path)
    report = stage_input(prompts, None, JOB, chunk_size=3)
    assert report.manifest == Manifest(job_id=JOB, lines=12, samples=10, invalid=2, chunk_size=3, chunks=4)
    assert [b.line for b in report.invalid] == [4, 9]
    assert all_files(tmp_path) == before
    assert not (tmp_path / "out").exists()


def test_restaging_is_byte_identical(tmp_path: Path, prompts: Path) -> None:
    store = LocalStore(tmp_path / "out")
    stage_input(prompts, store, JOB, chunk_size=3)
    first = all_files(tmp_path / "out")
    stage_input(prompts, store, JOB, chunk_size=3)  # e.g. an enqueue killed before the manifest
    assert all_files(tmp_path / "out") == first
    other = LocalStore(tmp_path / "elsewhere")
    stage_input(prompts, other, JOB, chunk_size=3)
    assert all_files(tmp_path / "elsewhere") == first


def test_restaging_over_a_partial_staging(tmp_path: Path, prompts: Path) -> None:
    store = LocalStore(tmp_path / "out")
    stage_input(prompts, store, JOB, chunk_size=3)
    complete = all_files(tmp_path / "out")
    (tmp_path / "out" / "manifest.json").unlink()
    (tmp_path / "out" / "inputs" / "chunk-000002.jsonl").write_bytes(b'{"id": "half')
    stage_input(prompts, store, JOB, chunk_size=3)
    assert all_files(tmp_path / "out") == complete


def test_missing_input_raises_input_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        stage_input(tmp_path / "missing.jsonl", LocalStore(tmp_path / "out"), JOB, chunk_size=3)
    assert not (tmp_path / "out").exists()


# -- encode / decode -------------------------------------------------------------------------------------


def test_decode_chunk_round_trip_with_awkward_text() -> None:
    samples = [
        Sample(id="plain", messages=user("hello"), line=1),
        Sample(
            id="ünï-code-\u2028-\x85",
            messages=[
                {"role": "system", "content": "line1\nline2\r\nline3\rend\ttab"},
                {
                    "role": "user",
                    "content": "emoji 🧪, CJK 漢字, NEL \x85, LS \u2028, PS \u2029, \x0b\x0c\x1c",
                },
                {"role": "assistant", "content": '"quotes" and \\backslashes\\'},
                {"role": "tool", "content": ""},
            ],
            line=2,
        ),
        Sample(id="L3", messages=user("x" * 10_000), line=3),
    ]
    data = b"\n".join(encode_sample(s) for s in samples) + b"\n"
    assert data.count(b"\n") == len(samples)  # one physical line per sample
    assert decode_chunk(data) == samples


def test_encode_sample_is_compact_utf8_json() -> None:
    line = encode_sample(Sample(id="a", messages=user("é"), line=7))
    assert line == '{"id": "a", "line": 7, "messages": [{"role": "user", "content": "é"}]}'.encode()


def test_decode_chunk_skips_blank_lines() -> None:
    data = (
        b"\n"
        + encode_sample(Sample("a", user("x"), 1))
        + b"\n\n  \n"
        + encode_sample(Sample("b", user("y"), 2))
    )
    assert [s.id for s in decode_chunk(data)] == ["a", "b"]
    assert decode_chunk(b"") == []


def test_chunked_groups_and_reports_invalid() -> None:
    items: list[Sample | InvalidLine] = [Sample(f"s{i}", user("q"), i) for i in range(1, 6)]
    items.insert(2, InvalidLine("f", 99, "bad"))
    seen: list[InvalidLine] = []
    groups = list(chunked(items, 2, seen.append))
    assert [[s.id for s in g] for g in groups] == [["s1", "s2"], ["s3", "s4"], ["s5"]]
    assert seen == [InvalidLine("f", 99, "bad")]


def test_multi_turn_samples_are_staged_without_their_old_answers_and_counted_in_turns(
    tmp_path: Path,
) -> None:
    convo = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "q1"},
        {"from": "gpt", "value": "OLD ANSWER 1"},
        {"from": "human", "value": "q2"},
        {"from": "gpt", "value": "OLD ANSWER 2"},
    ]
    path = write_input(
        tmp_path / "in.jsonl",
        [{"id": "one", "prompt": "q"}, {"id": "two", "conversations": convo}, {"id": "x", "prompt": "y"}],
    )
    store = LocalStore(tmp_path / "all")
    manifest = stage_input(path, store, JOB, chunk_size=2).manifest
    assert (manifest.samples, manifest.turns, manifest.chunk_turns) == (3, 4, [3, 1])
    assert b"OLD ANSWER" not in store.read(input_key(0))
    staged = decode_chunk(store.read(input_key(0)))[1]
    assert [m["role"] for m in staged.messages] == ["system", "user", "assistant", "user"]
    assert staged.messages[2]["content"] == ""  # marks the end of turn 1, nothing more
    assert load_manifest(store) == manifest

    last = LocalStore(tmp_path / "last")
    manifest = stage_input(path, last, JOB, chunk_size=2, turns="last").manifest
    assert (manifest.turns, manifest.chunk_turns) == (None, None)  # one turn per sample
    assert b"OLD ANSWER 1" in last.read(input_key(0))  # sent as is
    assert b"OLD ANSWER 2" not in last.read(input_key(0))  # the turn to regenerate
