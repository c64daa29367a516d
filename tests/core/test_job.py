"""Tests for dflash_tasks.core.job: job identity, job.json and manifest files, chunk keys, job mismatches."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import JobMismatch, StoreError
from dflash_tasks.core.job import (
    JOB_KEY,
    MANIFEST_KEY,
    GenerationSpec,
    JobDefinition,
    Manifest,
    check_same_job,
    chunk_name,
    input_key,
    output_key,
    parse_chunk_key,
)
from dflash_tasks.store import LocalStore
from dflash_tasks.store.jobfiles import done_chunks, load_job, load_manifest

FP = "sha256:" + "ab" * 32
FP2 = "sha256:" + "cd" * 32
SPEC = GenerationSpec(model="Qwen/Qwen3-8B")

# One different value per spec field.
CHANGED: dict[str, Any] = {
    "model": "Qwen/Qwen3-32B",
    "max_tokens": 8192,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "thinking": False,
    "chunk_size": 32,
    "turns": "last",
    "history_reasoning": "keep",
    "budget_policy": "horizon",
    "seed": 7,
}


def test_every_spec_field_has_a_changed_value() -> None:
    assert set(CHANGED) == {f.name for f in dataclasses.fields(GenerationSpec)}
    assert all(getattr(SPEC, k) != v for k, v in CHANGED.items())


def test_spec_defaults_follow_qwen3_thinking_recommendation() -> None:
    assert SPEC.sampling() == {
        "max_tokens": 4096,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "enable_thinking": True,
    }
    assert SPEC.chunk_size == 64


# -- job id ------------------------------------------------------------------------------------------


def test_job_id_is_stable_and_short_hex() -> None:
    a = JobDefinition.create(FP, "prompts.jsonl", SPEC)
    b = JobDefinition.create(FP, "prompts.jsonl", GenerationSpec(model="Qwen/Qwen3-8B"))
    assert a.job_id == b.job_id
    assert re.fullmatch(r"[0-9a-f]{16}", a.job_id)


def test_job_id_pinned_value() -> None:
    # A change here silently orphans every existing output root: it must be deliberate.
    assert JobDefinition.create(FP, "x", SPEC).job_id == "381ac05ebeb77ed7"
    # Jobs made before the turns field generated the last turn only: with turns "last" they keep
    # their ids (the field is not part of the identity then).
    assert JobDefinition.create(FP, "x", dataclasses.replace(SPEC, turns="last")).job_id == "fb46d04a1e5f431d"


def test_a_job_json_from_before_the_turns_field_is_a_last_turn_job_with_its_old_id() -> None:
    doc = json.loads(JobDefinition.create(FP, "x", SPEC).to_json())
    del doc["spec"]["turns"]
    doc["job_id"] = "fb46d04a1e5f431d"
    old = JobDefinition.from_json(json.dumps(doc).encode(), "job.json")
    assert old.spec.turns == "last"
    check_same_job(old, JobDefinition.create(FP, "x", dataclasses.replace(SPEC, turns="last")), "/out")
    with pytest.raises(JobMismatch, match="turns: the output has 'last', this run asks for 'all'"):
        check_same_job(old, JobDefinition.create(FP, "x", SPEC), "/out")


def test_a_horizon_job_records_its_policy_and_a_fixed_one_writes_what_it_always_did() -> None:
    fixed = JobDefinition.create(FP, "x", SPEC)
    assert "budget_policy" not in json.loads(fixed.to_json())["spec"]
    assert "budget_policy" not in SPEC.sampling() and not SPEC.at_horizon
    spec = dataclasses.replace(SPEC, budget_policy="horizon")
    job = JobDefinition.create(FP, "x", spec)
    assert json.loads(job.to_json())["spec"]["budget_policy"] == "horizon"
    assert JobDefinition.from_json(job.to_json(), "job.json") == job
    assert spec.sampling()["budget_policy"] == "horizon" and spec.at_horizon
    wider = JobDefinition.create(FP, "x", dataclasses.replace(spec, max_tokens=8192))
    with pytest.raises(JobMismatch, match="max_tokens is the trainer's --train-max-length"):
        check_same_job(job, wider, "/out")
    with pytest.raises(ValueError, match="budget_policy must be one of fixed, horizon"):
        GenerationSpec("m", budget_policy="cheap")


def test_turns_must_be_all_or_last() -> None:
    with pytest.raises(ValueError, match="turns must be one of all, last, got 'some'"):
        GenerationSpec("m", turns="some")


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_job_id_changes_with_every_spec_field(field: str) -> None:
    base = JobDefinition.create(FP, "p.jsonl", SPEC)
    other = JobDefinition.create(FP, "p.jsonl", dataclasses.replace(SPEC, **{field: CHANGED[field]}))
    assert other.job_id != base.job_id


def test_job_id_changes_with_the_input_fingerprint_only() -> None:
    base = JobDefinition.create(FP, "p.jsonl", SPEC)
    assert JobDefinition.create(FP2, "p.jsonl", SPEC).job_id != base.job_id
    # The file name is not part of the identity: a renamed copy of the same bytes is the same job.
    assert JobDefinition.create(FP, "renamed.jsonl", SPEC).job_id == base.job_id


def test_all_single_field_changes_give_distinct_ids() -> None:
    ids = {JobDefinition.create(FP, "p", SPEC).job_id, JobDefinition.create(FP2, "p", SPEC).job_id}
    for field, value in CHANGED.items():
        ids.add(JobDefinition.create(FP, "p", dataclasses.replace(SPEC, **{field: value})).job_id)
    assert len(ids) == len(CHANGED) + 2


# -- job.json ----------------------------------------------------------------------------------------


def test_job_json_round_trip() -> None:
    spec = GenerationSpec(
        "m", max_tokens=100, temperature=0.0, top_p=1.0, top_k=-1, thinking=False, chunk_size=7
    )
    job = JobDefinition.create(FP, "in.jsonl.gz", spec)
    data = job.to_json()
    doc = json.loads(data)
    assert doc["version"] == 1
    assert doc["job_id"] == job.job_id
    assert doc["input_fingerprint"] == FP
    assert doc["input_name"] == "in.jsonl.gz"
    fields = dataclasses.asdict(spec)
    assert fields.pop("budget_policy") == "fixed"  # left out of a fixed job's job.json, as before
    assert fields.pop("seed") is None  # a request's (a looped sample's repair), never a job's
    assert doc["spec"] == fields
    assert data.endswith(b"\n")
    assert JobDefinition.from_json(data, "job.json") == job


def test_job_json_is_deterministic() -> None:
    assert JobDefinition.create(FP, "a", SPEC).to_json() == JobDefinition.create(FP, "a", SPEC).to_json()


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"job_id": "x", "spec": {"model": "m"}}',
        b'{"job_id": "x", "input_fingerprint": "f", "spec": {"model": "m", "unknown": 1}}',
        b'{"job_id": "x", "input_fingerprint": "f", "spec": "m"}',
    ],
)
def test_invalid_job_json_is_a_store_error_naming_the_file(data: bytes) -> None:
    with pytest.raises(StoreError, match=re.escape("/out/job.json is not a valid dflash job file")):
        JobDefinition.from_json(data, "/out/job.json")


def test_load_job_and_manifest_from_a_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert load_job(store) is None
    assert load_manifest(store) is None
    job = JobDefinition.create(FP, "p.jsonl", SPEC)
    manifest = Manifest(job.job_id, lines=10, samples=9, invalid=1, chunk_size=4, chunks=3)
    store.write(JOB_KEY, job.to_json())
    store.write(MANIFEST_KEY, manifest.to_json())
    assert load_job(store) == job
    assert load_manifest(store) == manifest


def test_load_corrupt_files_name_the_location(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write(JOB_KEY, b"{")
    store.write(MANIFEST_KEY, b'{"job_id": "x"}')
    with pytest.raises(StoreError, match=re.escape(f"{tmp_path}/job.json")):
        load_job(store)
    with pytest.raises(StoreError, match=re.escape(f"{tmp_path}/manifest.json")):
        load_manifest(store)


# -- check_same_job ----------------------------------------------------------------------------------


def test_same_job_passes() -> None:
    a = JobDefinition.create(FP, "a.jsonl", SPEC)
    b = JobDefinition.create(FP, "renamed.jsonl", SPEC)
    check_same_job(a, b, "/out")  # no exception


def test_mismatch_names_every_differing_field_and_the_input() -> None:
    existing = JobDefinition.create(FP, "old.jsonl", SPEC)
    wanted = JobDefinition.create(FP2, "new.jsonl", dataclasses.replace(SPEC, **CHANGED))
    with pytest.raises(JobMismatch) as info:
        check_same_job(existing, wanted, "/data/out")
    message = str(info.value)
    assert f"/data/out already holds job {existing.job_id}" in message
    assert "old.jsonl" in message and "new.jsonl" in message
    assert FP[:19] in message and FP2[:19] in message
    for field, value in CHANGED.items():
        assert f"{field}: the output has {getattr(SPEC, field)!r}, this run asks for {value!r}" in message
    assert message.count("\n  - ") == len(CHANGED) + 1
    assert "--output" in message


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_mismatch_names_only_the_differing_field(field: str) -> None:
    existing = JobDefinition.create(FP, "p.jsonl", SPEC)
    wanted = JobDefinition.create(FP, "p.jsonl", dataclasses.replace(SPEC, **{field: CHANGED[field]}))
    with pytest.raises(JobMismatch) as info:
        check_same_job(existing, wanted, "/out")
    message = str(info.value)
    assert f"  - {field}: " in message
    assert message.count("\n  - ") == 1
    assert "input:" not in message


def test_mismatch_of_input_only() -> None:
    existing = JobDefinition.create(FP, "a.jsonl", SPEC)
    wanted = JobDefinition.create(FP2, "b.jsonl", SPEC)
    with pytest.raises(JobMismatch) as info:
        check_same_job(existing, wanted, "/out")
    message = str(info.value)
    assert (
        "input: the output holds a.jsonl (sha256:abababababab), this run reads b.jsonl (sha256:cdcdcdcdcdcd)"
        in message
    )
    assert message.count("\n  - ") == 1


# -- manifest ----------------------------------------------------------------------------------------


def test_chunk_samples_full_and_last_chunk() -> None:
    m = Manifest("j", lines=110, samples=100, invalid=10, chunk_size=32, chunks=4)
    assert [m.chunk_samples(c) for c in range(4)] == [32, 32, 32, 4]
    assert sum(m.chunk_samples(c) for c in range(m.chunks)) == m.samples


def test_chunk_samples_exact_multiple_and_single_chunk() -> None:
    m = Manifest("j", lines=64, samples=64, invalid=0, chunk_size=16, chunks=4)
    assert [m.chunk_samples(c) for c in range(4)] == [16, 16, 16, 16]
    one = Manifest("j", lines=5, samples=5, invalid=0, chunk_size=64, chunks=1)
    assert one.chunk_samples(0) == 5


def test_manifest_round_trip_and_errors() -> None:
    m = Manifest("j", lines=3, samples=2, invalid=1, chunk_size=64, chunks=1)
    assert Manifest.from_json(m.to_json(), "m") == m
    assert json.loads(m.to_json()) == {k: v for k, v in dataclasses.asdict(m).items() if v is not None}
    assert m.total_turns == 2 and m.turns_of(0) == 2  # single-turn: a turn per sample
    for bad in (
        b"nope",
        b'{"job_id": "j"}',
        b'{"job_id": "j", "lines": 1, "samples": 1, "invalid": 0, "chunk_size": 1, "chunks": 1, "extra": 2}',
        b'{"job_id": "j", "lines": 1, "samples": 1, "invalid": 0, "chunk_size": 1, "chunks": 1, '
        b'"turns": 3, "chunk_turns": [1, 2]}',
    ):
        with pytest.raises(StoreError, match="where is not a valid dflash manifest"):
            Manifest.from_json(bad, "where")


def test_manifest_of_a_multi_turn_job_counts_turns_per_chunk() -> None:
    m = Manifest("j", lines=5, samples=5, invalid=0, chunk_size=2, chunks=3, turns=9, chunk_turns=[3, 5, 1])
    assert m.total_turns == 9 and [m.turns_of(c) for c in range(3)] == [3, 5, 1]
    text = m.to_json().decode()
    assert '"chunk_turns": [3, 5, 1]' in text  # one line, not one per chunk
    assert Manifest.from_json(m.to_json(), "m") == m


# -- chunk keys ----------------------------------------------------------------------------------------


def test_chunk_key_names() -> None:
    assert chunk_name(0) == "chunk-000000.jsonl"
    assert input_key(12) == "inputs/chunk-000012.jsonl"
    assert output_key(123456) == "outputs/chunk-123456.jsonl"
    assert output_key(1234567) == "outputs/chunk-1234567.jsonl"


@pytest.mark.parametrize("chunk", [0, 1, 999_999, 1_000_000, 12_345_678])
def test_parse_chunk_key_round_trip(chunk: int) -> None:
    assert parse_chunk_key(output_key(chunk)) == chunk
    assert parse_chunk_key(input_key(chunk)) == chunk
    assert parse_chunk_key(chunk_name(chunk)) == chunk


@pytest.mark.parametrize(
    "key",
    [
        "outputs/chunk-.jsonl",
        "outputs/chunk-00001a.jsonl",
        "outputs/chunk--1.jsonl",
        "outputs/chunk-+1.jsonl",
        "outputs/chunk- 1.jsonl",
        "outputs/chunk-000001.json",
        "outputs/chunk-000001.jsonl.tmp",
        "outputs/.chunk-000001.jsonl.tmp-0123456789ab",
        "outputs/part-000001.jsonl",
        "outputs/chunk-000001.jsonl/x",
        "job.json",
        "",
    ],
)
def test_parse_chunk_key_rejects_other_names(key: str) -> None:
    assert parse_chunk_key(key) is None


@pytest.mark.parametrize("key", ["outputs/chunk-\u0663.jsonl", "outputs/chunk-\u00b2.jsonl"])
def test_parse_chunk_key_rejects_non_ascii_digits(key: str) -> None:
    assert parse_chunk_key(key) is None


def test_done_chunks_ignores_temp_and_other_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for chunk in (0, 2, 5):
        store.write(output_key(chunk), b"{}\n")
    store.write(input_key(1), b"{}\n")  # staged input, not done
    outputs = tmp_path / "outputs"
    (outputs / ".chunk-000001.jsonl.tmp-0123456789ab").write_bytes(b"partial")
    (outputs / "chunk-000003.jsonl.tmp").write_bytes(b"partial")
    (outputs / "notes.txt").write_bytes(b"hello")
    (outputs / "chunk-000004.json").write_bytes(b"{}")
    (outputs / "chunk-000006.jsonl").mkdir()  # a folder is not an object
    assert done_chunks(store) == {0, 2, 5}


def test_done_chunks_of_an_empty_root(tmp_path: Path) -> None:
    assert done_chunks(LocalStore(tmp_path / "nothing")) == set()


def test_done_chunks_survives_a_stray_non_ascii_digit_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write(output_key(0), b"{}\n")
    (tmp_path / "outputs" / "chunk-\u00b2.jsonl").write_bytes(b"stray")
    (tmp_path / "outputs" / "chunk-\u0663.jsonl").write_bytes(b"stray")
    assert done_chunks(store) == {0}


def test_history_reasoning_keep_names_another_job_and_drop_keeps_the_old_ids() -> None:
    from dflash_tasks.core.job import GenerationSpec, JobDefinition

    base = JobDefinition.create("sha256:x", "in", GenerationSpec(model="m"))
    assert "history_reasoning" not in GenerationSpec(model="m").identity()
    keep = JobDefinition.create("sha256:x", "in", GenerationSpec(model="m", history_reasoning="keep"))
    assert keep.job_id != base.job_id
    assert JobDefinition.from_json(keep.to_json(), "job.json").spec.history_reasoning == "keep"
    with pytest.raises(ValueError, match="history_reasoning must be one of drop, keep"):
        GenerationSpec(model="m", history_reasoning="some")


def test_an_amendment_is_written_to_job_json_and_leaves_the_jobs_identity() -> None:
    from dflash_tasks.core.job import Amendment

    job = JobDefinition.create(FP, "in.jsonl", SPEC)
    assert b"amendments" not in job.to_json() and job.repair_max_tokens is None  # as always written
    amended = dataclasses.replace(job, amendments=(Amendment(8192, 1.5), Amendment(16384, 2.5)))
    back = JobDefinition.from_json(amended.to_json(), "job.json")
    assert back == amended and back.job_id == job.job_id and back.repair_max_tokens == 16384
    assert json.loads(amended.to_json())["amendments"][0] == {
        "kind": "repair_truncated",
        "max_tokens": 8192,
        "at": 1.5,
    }
