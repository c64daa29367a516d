"""The samples pager: pages over chunk files with filters, ids, random draws and repair rounds."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_tasks.monitoring.page import pager
from dflash_tasks.monitoring.page.pager import Cursor, SampleFilter, find_sample, random_sample, read_page
from tests.monitoring.page.records_support import make_record, store_with


def outcome_store(tmp_path: Path):  # type: ignore[no-untyped-def]
    chunks = {
        c: [
            make_record(
                f"s{c}-{i}",
                tokens=10 * (i + 1),
                finish="length" if i % 3 == 0 else "stop",
                checks=("truncated",) if i % 3 == 0 else (),
            )
            for i in range(6)
        ]
        for c in range(4)
    }
    chunks[2][5] = make_record("s2-5", ok=False)
    return store_with(tmp_path, chunks)


def test_pages_walk_every_sample_once_in_order(tmp_path: Path) -> None:
    store = outcome_store(tmp_path)
    seen: list[str] = []
    start = Cursor()
    while True:
        page = read_page(store, SampleFilter(), start, size=5)
        seen += [f.record.id for f in page.rows]
        if page.next is None:
            break
        start = page.next
    assert seen == [f"s{c}-{i}" for c in range(4) for i in range(6)]


def test_filters_select_exactly_the_matching_samples(tmp_path: Path) -> None:
    store = outcome_store(tmp_path)
    truncated = read_page(store, SampleFilter(outcome="truncated"), size=100)
    assert [f.record.id for f in truncated.rows] == [f"s{c}-{i}" for c in range(4) for i in (0, 3)]
    failed = read_page(store, SampleFilter(outcome="failed"), size=100)
    assert [f.record.id for f in failed.rows] == ["s2-5"]
    by_check = read_page(store, SampleFilter(check="truncated"), size=100)
    assert [f.record.id for f in by_check.rows] == [f.record.id for f in truncated.rows]
    long_ones = read_page(store, SampleFilter(min_tokens=50, max_tokens=60), size=100)
    assert {f.record.usage.completion_tokens for f in long_ones.rows} == {50, 60}
    assert [f.record.id for f in read_page(store, SampleFilter(id_contains="s3-"), size=100).rows] == [
        f"s3-{i}" for i in range(6)
    ]


def test_a_page_reads_a_bounded_number_of_chunk_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = outcome_store(tmp_path)
    monkeypatch.setattr(pager, "MAX_CHUNKS_PER_PAGE", 2)
    page = read_page(store, SampleFilter(outcome="failed"), size=100)  # the only one is in chunk 2
    assert page.rows == () and page.chunks_read == 2 and page.next == Cursor(2, 0)
    after = read_page(store, SampleFilter(outcome="failed"), page.next, size=100)
    assert [f.record.id for f in after.rows] == ["s2-5"] and after.next is None


def test_a_repaired_sample_shows_its_latest_record(tmp_path: Path) -> None:
    store = store_with(
        tmp_path,
        {0: [make_record("a"), make_record("b", ok=False)]},
        {(0, 1): [make_record("b", tokens=99)]},
    )
    found = find_sample(store, "b")
    assert found is not None and found.record.ok and found.record.usage.completion_tokens == 99
    assert read_page(store, SampleFilter(outcome="failed")).rows == ()


def test_find_by_id_with_and_without_the_chunk_hint(tmp_path: Path) -> None:
    store = outcome_store(tmp_path)
    hinted = find_sample(store, "s3-2", chunk_hint=3)
    assert hinted is not None and (hinted.chunk, hinted.index) == (3, 2)
    assert find_sample(store, "s3-2", chunk_hint=0) == hinted  # a wrong hint still finds it
    assert find_sample(store, "nope") is None


def test_random_draws_come_from_the_stored_samples(tmp_path: Path) -> None:
    store = outcome_store(tmp_path)
    rng = random.Random(7)
    draws = {f.record.id for f in (random_sample(store, rng) for _ in range(40)) if f is not None}
    assert len(draws) > 5 and all(d.startswith("s") for d in draws)
    assert random_sample(store_with(tmp_path / "empty", {}), rng) is None


def test_cursors_and_filters_reject_bad_input() -> None:
    assert Cursor.parse("12.40") == Cursor(12, 40) and str(Cursor(3, 1)) == "3.1"
    for bad in ("x", "1.y", "-1.0"):
        with pytest.raises(ValueError, match="bad cursor"):
            Cursor.parse(bad)
    with pytest.raises(ValueError, match="outcome must be one of"):
        SampleFilter(outcome="weird")


def test_the_source_filter_selects_the_samples_of_one_input_source(tmp_path: Path) -> None:
    records = [replace(make_record(f"s{i}"), source="math" if i % 2 else "code") for i in range(4)]
    store = store_with(tmp_path, {0: [*records, make_record("plain")]})
    assert [f.record.id for f in read_page(store, SampleFilter(source="math")).rows] == ["s1", "s3"]
    assert [f.record.id for f in read_page(store, SampleFilter(source="code")).rows] == ["s0", "s2"]
    assert len(read_page(store, SampleFilter()).rows) == 5
