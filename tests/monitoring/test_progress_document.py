"""The progress document's one encoding: for the same snapshot it is byte for byte what
``progress.json`` (indented) and ``status --json`` (one line) held before it was typed (the golden
documents were written by the untyped ``summarize``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_tasks.monitoring.progress import progress_document
from tests.monitoring.progress_cases import CASES, NOW

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_document_is_byte_for_byte_the_golden_one(name: str) -> None:
    golden = (GOLDEN / f"progress_{name}.json").read_text()
    document = progress_document(CASES[name](), NOW, "w@h")
    assert document.to_json(indent=1) + "\n" == golden  # progress.json
    assert document.to_json() == json.dumps(json.loads(golden))  # status --json


def test_a_tuned_workers_state_reaches_its_row_typed() -> None:
    rows = {w.name: w for w in progress_document(CASES["running"](), NOW, "w@h").workers}
    tuner = rows["gpu0@h"].tuner
    assert tuner is not None and tuner.target == 72 and tuner.phase == "climbing"
    assert [p.target for p in tuner.curve] == [48, 72]
    assert rows["gpu1@h"].tuner is None  # a field that is not a state reads as a fixed target
