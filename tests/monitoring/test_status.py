"""``status``: the live rich table, the plain-text snapshots and the watch loop (no Redis)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER
from dflash_tasks.core.states import JobState
from dflash_tasks.monitoring import status
from dflash_tasks.monitoring.progress import progress_document
from dflash_tasks.monitoring.progress_document import ProgressDocument
from dflash_tasks.monitoring.status import watch
from dflash_tasks.monitoring.status_view import (
    SERVER_AVERAGE_NOTE,
    WORKER_HEADER,
    render,
    render_table,
    summary_rows,
)
from tests.monitoring.test_progress import HOUR, NOW, live_workers, snapshot, steady_buckets


def seed_doc() -> ProgressDocument:
    """The seed's numbers (913,786 samples, 7 GPUs at $27/h), a third done, with spec and a queue."""
    per, beats = live_workers(7, NOW)
    doc = progress_document(
        snapshot(
            total_samples=913_786,
            total_chunks=14_278,
            done_chunks=4_759,
            done_samples=304_595,
            buckets=steady_buckets(NOW, 5.6, 15_900),
            stats={"samples_ok": 304_595.0, "completion_tokens": 702_396_070.0},
            job={"started_at": str(NOW - 15 * HOUR), "gpu_tick": str(NOW), "gpu_seconds": "0"},
            per_worker=per,
            workers=beats,
            gpu_hour_usd=27 / 7,
        ),
        NOW,
    )
    spec = replace(doc.spec, accept_length=3.6, source=SOURCE_PER_REQUEST, verify_passes=195_110, window=3.55)
    w = list(doc.workers)
    w[0] = replace(w[0], spec_accept_length=3.61, spec_accept_length_window=3.58)
    w[1] = replace(w[1], spec_accept_length=3.2, spec_accept_source=SOURCE_SERVER)
    w[2] = replace(w[2], healthy=False)
    w[3] = replace(w[3], alive=False)
    return replace(
        doc, queue_depth=12, queue="dflash.qwen3-8b", spec=spec, workers=tuple(w), warnings=("a warning",)
    )


def done(doc: ProgressDocument, **header: Any) -> ProgressDocument:
    """``doc`` with the job done (and other header fields changed)."""
    return replace(doc, header=replace(doc.header, state=JobState.DONE, **header))


def table_text(doc: ProgressDocument, width: int = 120) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(render_table(doc))
    return console.export_text()


def test_the_table_shows_every_figure_of_the_plain_summary() -> None:
    doc = seed_doc()
    text = table_text(doc)
    assert f"job {doc.header.job_id}  running" in text and "m  ->  /out" in text
    assert "33.3%" in text and "304,595 / 913,786 samples" in text
    for label, figures in summary_rows(doc):  # samples, chunks, rate, ETA, elapsed, tokens, spec, cost
        assert f"{label}  " in text and figures in text, label
    assert "5.60 samples/s" in text and "15,900 tok/s" in text and "by tokens" in text
    assert "queue depth 12 (dflash.qwen3-8b)" in text and "accept length 3.60 per request" in text
    assert "7 GPUs x $3.86/GPU-h" in text and "projected total $" in text
    assert " ".join(WORKER_HEADER[:3]) in " ".join(text.split())
    rows = {cells[0]: cells for cells in (line.strip("│ ").split() for line in text.splitlines()) if cells}
    rows = {name: cells for name, cells in rows.items() if name.endswith("@h")}
    assert sorted(rows) == [f"gpu{i}@h" for i in range(7)]  # one row per GPU
    assert rows["gpu0@h"][1:3] == ["http://e0", "up"] and rows["gpu0@h"][-4:-2] == ["3.61", "3.58"]
    assert rows["gpu1@h"][-4] == "3.20*" and SERVER_AVERAGE_NOTE in text
    assert rows["gpu2@h"][2] == "DOWN" and rows["gpu3@h"][2] == "gone"
    assert "! a warning" in text


def test_the_table_of_a_finished_job_and_text_that_looks_like_markup() -> None:
    doc = done(seed_doc(), output="/out/[bold]run[/bold]")
    doc = replace(doc, workers=(replace(doc.workers[0], endpoint="http://[::1]:30000"), *doc.workers[1:]))
    text = table_text(doc)
    assert "job j1  done" in text and "/out/[bold]run[/bold]" in text and "http://[::1]:30000" in text
    assert "finished  in" in text and "ETA" not in text and "projected total" not in text


def test_the_table_wraps_on_a_narrow_terminal_without_losing_figures() -> None:
    text = table_text(seed_doc(), width=80)
    flat = "".join(ch for ch in text if ch not in "│ \n")
    assert "5.60samples/s" in flat and "projectedtotal$" in flat


# --- the watch loop ------------------------------------------------------------------------------


def docs_then_done(n: int = 3) -> tuple[list[ProgressDocument], Callable[[], ProgressDocument]]:
    """``n`` snapshots of a running job, the last one done; and a snapshot() that serves them."""
    seed = seed_doc()
    docs = [replace(seed, samples=replace(seed.samples, done=seed.samples.done + i)) for i in range(n)]
    docs[-1] = done(docs[-1])
    served: Iterator[ProgressDocument] = iter(docs)
    return docs, lambda: next(served)


def test_watch_without_a_terminal_prints_plain_snapshots_separated_by_a_blank_line() -> None:
    docs, serve = docs_then_done()
    out = io.StringIO()
    assert watch(serve, 0.001, out) == 0
    assert out.getvalue() == "\n\n".join(render(doc) for doc in docs) + "\n"
    assert "\x1b" not in out.getvalue()


def test_watch_json_prints_one_document_per_line() -> None:
    docs, serve = docs_then_done()
    out = io.StringIO()
    assert watch(serve, 0.001, out, as_json=True, live=Console(file=io.StringIO())) == 0
    assert out.getvalue().splitlines() == [doc.to_json() for doc in docs]
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [doc.to_dict() for doc in docs]


def test_without_watch_one_snapshot() -> None:
    docs, serve = docs_then_done()
    out = io.StringIO()
    assert watch(serve, None, out, live=Console(file=io.StringIO(), force_terminal=True)) == 0
    assert out.getvalue() == render(docs[0]) + "\n"


def test_watch_on_a_terminal_redraws_one_table_in_place_until_done() -> None:
    docs, serve = docs_then_done()
    out, screen = io.StringIO(), io.StringIO()
    live = Console(file=screen, force_terminal=True, width=120, color_system=None)
    assert watch(serve, 0.001, out, live=live) == 0
    assert out.getvalue() == ""  # nothing printed beside the live table
    drawn = screen.getvalue()
    assert "\x1b[2K" in drawn  # lines erased: redrawn in place
    assert drawn.count("╭─ job j1") >= len(docs)  # a frame per snapshot (and one as it stops)
    last = drawn[drawn.rindex("╭─ job j1") :]
    assert "job j1  done" in last and "304,597 / 913,786 samples" in last


def test_ctrl_c_stops_the_live_table() -> None:
    calls = 0

    def interrupted() -> ProgressDocument:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise KeyboardInterrupt
        return seed_doc()

    live = Console(file=io.StringIO(), force_terminal=True, width=120)
    with pytest.raises(KeyboardInterrupt):
        watch(interrupted, 0.001, io.StringIO(), live=live)


# --- the command, with the store and Redis stubbed -------------------------------------------------


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], ProgressDocument]], None]:
    class Job:
        job_id = "j1"

    def use(serve: Callable[[], ProgressDocument]) -> None:
        monkeypatch.setattr(status, "open_store", lambda uri, settings: object())
        monkeypatch.setattr(status, "load_job", lambda store: Job())
        monkeypatch.setattr(status, "connect_bookkeeping", lambda settings: None)
        monkeypatch.setattr(status, "compute_document", lambda *args, **kwargs: serve())

    return use


def test_main_watch_piped_prints_plain_text(
    stubbed: Callable[[Callable[[], ProgressDocument]], None],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    docs, serve = docs_then_done()
    stubbed(serve)
    assert status.main(["--output", str(tmp_path), "--watch", "0.001"]) == 0
    out = capsys.readouterr().out
    assert out == "\n\n".join(render(doc) for doc in docs) + "\n" and "\x1b" not in out


def test_main_exits_130_on_ctrl_c(
    stubbed: Callable[[Callable[[], ProgressDocument]], None], tmp_path: Path
) -> None:
    def interrupted() -> ProgressDocument:
        raise KeyboardInterrupt

    stubbed(interrupted)
    assert status.main(["--output", str(tmp_path), "--watch", "0.001"]) == 130


def test_the_summary_shows_loops_once_there_are_any() -> None:
    doc = seed_doc()
    assert "loops" not in dict(summary_rows(doc))
    counters = {**doc.counters, "check_looping": 3_046.0, "looped_generations": 3_500.0}
    looping = replace(doc, counters={**counters, "loop_tokens_saved": 9_000_000.0})
    assert dict(summary_rows(looping))["loops"] == (
        "3,046 samples stopped in a loop (1.0%) | 3,500 generations stopped, repairs included "
        "| 9,000,000 tokens of budget saved"
    )
