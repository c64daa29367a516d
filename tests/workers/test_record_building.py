"""The worker builds Records that encode exactly as the lines it wrote when records were dicts.

``tests/core/data/records-as-built.jsonl`` holds what ``make_record`` returned (``json.dumps(...,
ensure_ascii=False)``) before the record type existed, ``records-as-stored.jsonl`` the same records
after the chunk runner added the quality checks, for the samples built below. Since failures say
whether they may pass, a failed turn and its record also carry ``failure`` (after ``error``): the
only difference from those lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.quality import QualitySettings, with_checks
from dflash_tasks.core.record import Record, encode_records
from dflash_tasks.core.sample import Sample
from dflash_tasks.core.states import FailureKind
from workers.generation import WorkerIdentity, make_record, make_turn
from workers.sglang_client import Completion, MetaInfo, ServerIdentity

DATA = Path(__file__).parents[1] / "core" / "data"


def built() -> list[Record]:
    spec = GenerationSpec(model="Qwen/Qwen3-8B", max_tokens=512)
    msgs = [
        {"role": "system", "content": "Sé breve."},
        {"role": "user", "content": "q1 ✓"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "q2"},
    ]
    sample = Sample("s-1", msgs, 7)
    server = ServerIdentity("/models/qwen", "Qwen/Qwen3-8B", "0.5.23")
    who = WorkerIdentity("w1@host", "http://127.0.0.1:30000", server)
    meta = MetaInfo(spec_verify_ct=10, spec_accept_length=4.0, cached_tokens=3)
    c1 = Completion("thinking… about it", "answer one", "stop", 12, 40, 30, meta)
    c2 = Completion("", "", "length", 30, 512, 0, None)
    t1 = make_turn(msgs[:2], c1, None, 1.23456, 1)
    t2 = make_turn(msgs[3:], c2, None, 2.5, 2)
    failed = make_turn(msgs[3:], None, "HTTP 400: prompt too long", 0.01, 1, FailureKind.PERMANENT)
    return [
        make_record(spec, sample, who, [t1, t2], 2, 3.7891),
        make_record(spec, sample, WorkerIdentity("w2", "http://x"), [t1, failed], 2, 1.3),
        make_record(spec, Sample("s-2", msgs[:2], 8), who, [t1], 1, 1.3),
    ]


def with_failure(doc: dict[str, Any]) -> dict[str, Any]:
    """A line of the data files as written today: ``failure`` after ``error`` where it failed."""

    def add(part: dict[str, Any]) -> dict[str, Any]:
        if part["status"] == "ok":
            return part
        out: dict[str, Any] = {}
        for key, value in part.items():
            out[key] = value
            if key == "error":
                out["failure"] = "permanent"
        return out

    return add({**doc, "turns": [add(t) for t in doc["turns"]]})


def expected(name: str) -> list[str]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return [json.dumps(with_failure(json.loads(line)), ensure_ascii=False) for line in lines]


def test_built_records_encode_as_the_dicts_make_record_returned() -> None:
    lines = expected("records-as-built.jsonl")
    records = built()
    assert [r.to_json() for r in records] == lines
    assert [r.to_dict() for r in records] == [json.loads(line) for line in lines]
    assert [Record.from_json(r.to_json()) for r in records] == records
    assert sum(line.count('"failure": "permanent"') for line in lines) == 2  # the failed turn and record


def test_checked_records_make_the_chunk_file_the_chunk_runner_wrote() -> None:
    data = encode_records(with_checks(r, True, QualitySettings()) for r in built())
    assert data == "".join(line + "\n" for line in expected("records-as-stored.jsonl")).encode()
