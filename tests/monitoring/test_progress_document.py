"""The progress document's one encoding: for the same snapshot it is byte for byte what
``progress.json`` (indented) and ``status --json`` (one line) held before it was typed, and
``status`` draws it as it drew the dict (the goldens were made by the untyped ``summarize`` and
views, ``tests/monitoring/progress_cases.py`` holds the snapshots)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from dflash_tasks.monitoring.progress import progress_document
from dflash_tasks.monitoring.status_view import render, render_table
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


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``status`` shows the document's time in local time: UTC here, as when the goldens were made."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_status_shows_the_typed_document_as_it_showed_the_dict(name: str, utc: None) -> None:
    """The text and the live table are the goldens the dict-reading views drew for each snapshot."""
    document = progress_document(CASES[name](), NOW, "w@h")
    assert render(document) + "\n" == (GOLDEN / f"status_{name}.txt").read_text()
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(render_table(document))
    assert console.export_text() == (GOLDEN / f"table_{name}.txt").read_text()
