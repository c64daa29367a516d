"""verify on stores that hold what a broken run leaves: each problem found, counted and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import CorruptObject
from dflash_tasks.core.job import JOB_KEY, GenerationSpec, JobDefinition, output_key
from dflash_tasks.output.verify import Verification, verify
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store import LocalStore
from tests.helpers import REPO

# 10 lines: 9 samples (s0..s9 but s4 is a blank line) in chunks of 3 -> chunks 0, 1, 2
LINES = [json.dumps({"id": f"s{i}", "prompt": f"question {i}"}) if i != 4 else "" for i in range(10)]
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
    assert (manifest.samples, manifest.invalid, manifest.chunks) == (9, 1, 3)
    return inp, store


def write_chunks(store: LocalStore, chunks: dict[int, list[str]], failed: tuple[str, ...] = ()) -> None:
    for chunk, ids in chunks.items():
        store.write(output_key(chunk), b"".join(record(i, "failed" if i in failed else "ok") for i in ids))


ALL = {0: IDS[0:3], 1: IDS[3:6], 2: IDS[6:9]}


def test_a_complete_store_passes(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL, failed=("s7",))
    r = verify(str(inp), store)
    assert r.problems == [] and r.passed
    assert (r.lines, r.ok, r.failed, r.invalid, r.invalid_reported) == (10, 8, 1, 1, 1)
    assert (r.chunks, r.chunks_done, r.missing, r.duplicated, r.unexpected) == (3, 3, 0, 0, 0)


def test_duplicates_are_counted_and_named(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {**ALL, 2: [*ALL[2], "s1", "s1"]})
    r = verify(str(inp), store)
    assert (r.duplicated, r.missing, r.unexpected) == (2, 0, 0)
    assert r.problems == ["2 duplicate output records: s1 x3"]


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
        "6 input samples have no output record (chunks not stored: 1, 2): s3, s5, s6, s7, s8 and 1 more"
    ]


def test_a_record_missing_from_a_stored_chunk_is_named(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {**ALL, 1: ["s3", "s6"], 2: ["s7", "s8", "s9"]})  # s5 lost, s6 moved
    r = verify(str(inp), store)
    assert (r.missing, r.duplicated, r.missing_chunks) == (1, 0, [])
    assert r.problems == ["1 input samples have no output record (their chunks are stored without them): s5"]


def test_corrupt_records_are_named_by_place(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write(output_key(1), record("s3") + b'{"id": "s5", "stat\n' + b'{"status": "ok"}\n' + b"[1, 2]\n")
    r = verify(str(inp), store)
    assert r.problems == [
        "outputs/chunk-000001.jsonl:2: not a valid output record (not JSON)",
        "outputs/chunk-000001.jsonl:3: not a valid output record (no id)",
        "outputs/chunk-000001.jsonl:4: not a valid output record (no id)",
        "2 input samples have no output record (their chunks are stored without them): s5, s6",
    ]


class _CorruptChunk:
    """A store whose chunk 2 fails its checksum on read (as S3 reports a damaged object)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> bytes:
        if key == output_key(2):
            raise CorruptObject(f"{key}: sha256 mismatch")
        return self.inner.read(key)


def test_a_corrupt_chunk_object_is_named_and_its_samples_missing(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    r = verify(str(inp), _CorruptChunk(store))  # type: ignore[arg-type]
    assert (r.corrupted, r.chunks_done, r.missing, r.missing_chunks) == (1, 2, 3, [2])
    assert r.problems == [
        "outputs/chunk-000002.jsonl: sha256 mismatch; "
        "delete it and re-run enqueue to generate the chunk again",
        "3 input samples have no output record (chunks not stored: 2): s7, s8, s9",
    ]


def test_an_invalid_line_not_reported_is_a_problem(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, ALL)
    store.write("invalid.jsonl", b"")
    assert verify(str(inp), store).problems == [
        "1 invalid input lines, but 0 reported in invalid.jsonl and 1 in the manifest"
    ]


def test_an_output_without_a_job_says_so(tmp_path: Path) -> None:
    inp = tmp_path / "p.jsonl"
    inp.write_text(LINES[0] + "\n")
    r = verify(str(inp), LocalStore(tmp_path / "empty"))
    assert r.missing == 1 and r.problems == [f"{tmp_path / 'empty'} holds no staged job (run enqueue first)"]


def run_cli(inp: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tasks.verify", "--input", str(inp), "--output", str(out), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_exits_1_and_prints_each_problem(job: tuple[Path, LocalStore]) -> None:
    inp, store = job
    write_chunks(store, {0: [*ALL[0], "s0"], 1: ALL[1]})
    res = run_cli(inp, Path(store.root))
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines() == [
        "FAIL: 10 lines = 7 ok + 0 failed + 1 invalid; chunks 2/3; missing 3, duplicated 1",
        "  - 3 input samples have no output record (chunks not stored: 2): s7, s8, s9",
        "  - 1 duplicate output records: s0 x2",
    ]
    doc = json.loads(run_cli(inp, Path(store.root), "--json").stdout)
    assert Verification(**{k: v for k, v in doc.items() if k != "passed"}).problems == doc["problems"]
    assert doc["passed"] is False and doc["missing_chunks"] == [2] and doc["duplicated"] == 1
