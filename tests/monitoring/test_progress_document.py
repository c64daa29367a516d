"""The progress document's one encoding: for the same snapshot it is byte for byte what
``progress.json`` (indented) and ``status --json`` (one line) held before it was typed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_tasks.monitoring.progress import summarize
from tests.monitoring.progress_cases import CASES, NOW

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_document_is_byte_for_byte_the_golden_one(name: str) -> None:
    golden = (GOLDEN / f"progress_{name}.json").read_text()
    doc = summarize(CASES[name](), NOW, "w@h")
    assert json.dumps(doc, indent=1, sort_keys=False) + "\n" == golden  # progress.json
    assert json.dumps(doc) == json.dumps(json.loads(golden))  # status --json
