"""verify on stores that hold what a broken run leaves: each problem found, counted and named."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import CorruptObject
from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition, output_key, repair_key
from dflash_tasks.output.verify import _names, main, verify
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store import LocalStore

# 11 lines: 9 samples (s0..s10; line 5 is blank, line 11 is not JSON) in chunks of 3 -> chunks 0, 1, 2
LINES = [json.dumps({"id": f"s{i}", "prompt": f"question {i}"}) if i != 4 else "" for i in range(10)] + ["{"]
IDS = [f"s{i}" for i in range(10) if i != 4]


def record(sample_id: str, status: str = "ok") -> bytes:
    return json.dumps({"id": sample_id, "status": status, "content": "x"}).encode() + b"\n"


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, LocalStore]:
    inp = tmp_path / "prompts.jsonl"
    inp.write_text("\n".join(LINES) + "\n")
    store = LocalStore(tmp_path / "out")
    definition = JobDefinition.create("sha256:test", inp.name, GenerationSpec(model="m", chunk_size=3))
    store.write(JOB_KEY, definition.to_json())
    manifest = stage_input(inp, store, definition.job_id, 3).manifest
    assert (manifest.samples, manifest.invalid, manifest.chunks) == (9, 2, 3)
    return inp, store


def write_chunks(store: LocalStore, chunks: dict[int, list[str]], failed: tuple[str, ...] = ()) -> None:
    for chunk, ids in chunks.items():
        store.write(output_key(chunk), b"".join(record(i, "failed" if i in failed else "ok") for i in ids))


ALL = {0: IDS[0:3], 1: IDS[3:6], 2: IDS[6:9]}


def test_a_complete_store_passes(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL, failed=("s7", "s8"))
    store.write("outputs/README.txt", b"not a chunk\n")  # listed before the chunks, and ignored
    r = verify(str(inp), store)
    assert r.problems == [] and r.passed
    assert (r.lines, r.ok, r.failed, r.invalid, r.invalid_reported) == (11, 7, 2, 2, 2)
    assert (r.chunks, r.chunks_done, r.missing, r.duplicated, r.unexpected) == (3, 3, 0, 0, 0)


def test_duplicates_are_counted_and_named(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {**ALL, 2: [*ALL[2], "s1", "s1", "s2"]})
    r = verify(str(inp), store)
    assert (r.duplicated, r.missing, r.unexpected) == (3, 0, 0)
    assert r.problems == ["3 duplicate output records: s1 x3, s2 x2"]


def test_ids_not_in_the_input_are_counted_and_named(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {**ALL, 1: [*ALL[1], "zz", "s4"]})  # s4 is the blank line's number
    r = verify(str(inp), store)
    assert (r.unexpected, r.duplicated, r.missing) == (2, 0, 0)
    assert r.problems == ["2 output records whose id is not in the input: zz, s4"]


def test_missing_chunks_are_named_with_their_samples(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {0: ALL[0]})
    r = verify(str(inp), store)
    assert (r.missing, r.chunks_done, r.missing_chunks) == (6, 1, [1, 2])
    assert r.problems == [
        "6 input samples have no output record (chunks not stored: 1, 2): "
        "s3 (line 4), s5 (line 6), s6 (line 7), s7 (line 8), s8 (line 9) and 1 more"
    ]


def test_a_record_missing_from_a_stored_chunk_is_named(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {**ALL, 1: ["s3", "s6"], 2: ["s7", "s8", "s9"]})  # s5 lost, s6 moved
    r = verify(str(inp), store)
    assert (r.missing, r.duplicated, r.missing_chunks) == (1, 0, [])
    assert r.problems == [
        "1 input samples have no output record (their chunks are stored without them): s5 (line 6)"
    ]


def test_corrupt_records_are_named_by_place(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write(
        output_key(1),
        record("s3") + b"\n" + b'{"id": "s5", "stat\n' + b'{"status": "ok"}\n' + b"[1, 2]\n" + record("s6"),
    )
    r = verify(str(inp), store)
    assert r.problems == [  # a blank line is skipped, the lines after it still read
        "outputs/chunk-000001.jsonl:3: not a valid output record (not JSON)",
        "outputs/chunk-000001.jsonl:4: not a valid output record (no id)",
        "outputs/chunk-000001.jsonl:5: not a valid output record (no id)",
        "1 input samples have no output record (their chunks are stored without them): s5 (line 6)",
    ]


class _CorruptChunk:
    """A store whose chunks 0 and 1 fail their checksum on read (as S3 reports a damaged object)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> bytes:
        if key in (output_key(0), output_key(1)):
            raise CorruptObject(f"{key}: sha256 mismatch")
        return self.inner.read(key)


def test_a_corrupt_chunk_object_is_named_and_its_samples_missing(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    r = verify(str(inp), _CorruptChunk(store))  # type: ignore[arg-type]
    assert (r.corrupted, r.chunks_done, r.missing, r.missing_chunks, r.ok) == (2, 1, 6, [0, 1], 3)
    assert r.problems == [
        "outputs/chunk-000000.jsonl: sha256 mismatch; "
        "delete it and re-run enqueue to generate the chunk again",
        "outputs/chunk-000001.jsonl: sha256 mismatch; "
        "delete it and re-run enqueue to generate the chunk again",
        "6 input samples have no output record (chunks not stored: 0, 1): "
        "s0 (line 1), s1 (line 2), s2 (line 3), s3 (line 4), s5 (line 6) and 1 more",
    ]


def test_an_invalid_line_not_reported_is_a_problem(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write("invalid.jsonl", b"")
    assert verify(str(inp), store).problems == [
        "2 invalid input lines, but 0 reported in invalid.jsonl and 2 in the manifest"
    ]


def test_an_output_without_a_job_says_so(tmp_path: Path, job: tuple[Path, LocalStore]) -> None:
    inp = tmp_path / "p.jsonl"
    inp.write_text(LINES[0] + "\n")
    r = verify(str(inp), LocalStore(tmp_path / "empty"))
    assert r.missing == 1 and r.problems == [f"{tmp_path / 'empty'} holds no staged job (run enqueue first)"]
    _, staged = job
    staged.delete("manifest.json")  # staging was interrupted: job.json but no manifest
    assert verify(str(inp), staged).problems == [f"{staged.uri} holds no staged job (run enqueue first)"]


def test_names_are_listed_up_to_five() -> None:
    assert _names(["a", "b", "c", "d", "e"]) == "a, b, c, d, e"
    assert _names(["a", "b", "c", "d", "e", "f", "g"]) == "a, b, c, d, e and 2 more"


def test_the_command_exits_1_and_prints_each_problem(
    job: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, store = job
    write_chunks(store, {0: [*ALL[0], "s0"], 1: ALL[1]})
    args = ["--input", str(inp), "--output", str(store.root)]
    assert main(args) == 1
    assert capsys.readouterr().out.splitlines() == [
        "FAIL: 11 lines = 7 ok + 0 failed + 2 invalid; chunks 2/3; missing 3, duplicated 1",
        "      turns: 7 generated of 9 user turns (0 not sent: their conversation ended at a failed or "
        "truncated turn)",
        "  - 3 input samples have no output record (chunks not stored: 2): "
        "s7 (line 8), s8 (line 9), s9 (line 10)",
        "  - 1 duplicate output records: s0 x2",
    ]
    assert main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        **asdict(verify(str(inp), store)),
        "passed": False,
    }
    assert (doc["missing_chunks"], doc["duplicated"], doc["lines"], doc["valid"]) == ([2], 1, 11, 9)


def test_the_command_passes_a_complete_job_and_names_a_bad_input(
    job: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write(output_key(3), record("zz"))  # beyond the job's chunks: still read, named
    args = ["--input", str(inp), "--output", str(store.root)]
    assert main(args) == 1
    assert "1 output records whose id is not in the input: zz" in capsys.readouterr().out
    store.delete(output_key(3))
    assert main(args) == 0
    assert (
        capsys.readouterr().out
        == "PASS: 11 lines = 9 ok + 0 failed + 2 invalid; chunks 3/3; missing 0, duplicated 0\n"
        "      turns: 9 generated of 9 user turns (0 not sent: their conversation ended at a failed or "
        "truncated turn)\n"
    )
    assert main(["--input", str(tmp_path / "nope.jsonl"), "--output", str(store.root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope.jsonl" in err


def test_the_command_on_a_job_with_nothing_stored(
    job: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, store = job
    assert main(["--input", str(inp), "--output", str(store.root)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "FAIL: 11 lines = 0 ok + 0 failed + 2 invalid; chunks 0/3; missing 9, duplicated 0\n"
    )


def line(sample_id: str, status: str, **more: Any) -> bytes:
    return json.dumps({"id": sample_id, "status": status, "content": "x", **more}).encode() + b"\n"


def test_each_category_is_counted_from_the_current_records(
    job: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, store = job
    store.write(
        output_key(0), line("s0", "ok") + line("s1", "failed", failure="transient") + line("s2", "ok")
    )
    store.write(
        output_key(1), line("s3", "failed", failure="permanent") + line("s5", "failed") + line("s6", "ok")
    )
    store.write(
        output_key(2), line("s7", "failed", failure="transient") + line("s8", "ok") + line("s9", "ok")
    )
    # round 1 repaired s1 and failed s5 again; round 2 repaired s5; s7 is still pending
    store.write(repair_key(0, 1), line("s1", "ok", repair=1))
    store.write(repair_key(1, 1), line("s5", "failed", failure="transient", repair=1))
    store.write(repair_key(1, 2), line("s5", "ok", repair=2))
    r = verify(str(inp), store)
    assert r.passed and (r.duplicated, r.missing, r.repair_files) == (0, 0, 3)  # still exactly once
    assert (r.ok, r.repaired, r.failed, r.failed_permanent, r.failed_transient) == (7, 2, 2, 1, 1)
    assert r.as_dict()["failed_transient"] == 1 and r.as_dict()["repaired"] == 2
    args = ["--input", str(inp), "--output", str(store.root)]
    assert main(args) == 0
    assert main([*args, "--strict"]) == 1  # a transient failure remains
    out = capsys.readouterr().out
    assert "7 ok (2 repaired) + 2 failed (1 permanent, 1 transient: repair pending) + 2 invalid" in out
    assert "strict: 1 samples failed by a transient cause" in out
    store.write(repair_key(2, 1), line("s7", "ok", repair=1))
    assert main([*args, "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["failed_transient"] == 0


def test_a_repair_record_of_a_sample_its_chunk_does_not_hold_is_a_problem(
    job: tuple[Path, LocalStore],
) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write(repair_key(0, 1), line("s5", "ok", repair=1))  # s5 is chunk 1's
    r = verify(str(inp), store)
    assert not r.passed and r.duplicated == 0
    assert r.problems == [
        "outputs/chunk-000000.repair-1.jsonl:1: not a valid output record (id 's5' is not in "
        "outputs/chunk-000000.jsonl)"
    ]


def test_a_sample_a_repair_round_wrote_twice_is_a_duplicate(
    job: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, store = job
    store.write(
        output_key(0), line("s0", "ok") + line("s1", "failed", failure="transient") + line("s2", "ok")
    )
    write_chunks(store, {1: ALL[1], 2: ALL[2]})
    repaired = line("s1", "ok", repair=1, content="the repaired answer")
    store.write(repair_key(0, 1), repaired + line("s1", "ok", repair=1, content="again") + repaired)
    r = verify(str(inp), store)
    assert not r.passed and (r.duplicated, r.missing, r.ok, r.repaired) == (2, 0, 9, 1)
    assert r.problems == [
        f"outputs/chunk-000000.repair-1.jsonl:{n}: not a valid output record (id 's1' written again "
        "by round 1 of chunk 0: first at line 1)"
        for n in (2, 3)
    ]
    assert main(["--input", str(inp), "--output", str(store.root)]) == 1
    out = capsys.readouterr().out
    assert "duplicated 2" in out and "written again by round 1 of chunk 0" in out
    assert "answer" not in out and 'again"' not in out  # ids and places only, never sample text
