"""The page's views: the trainer's marks equal the loss-token count, sample text is escaped, auth holds."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import GenerationSpec, JobDefinition
from dflash_tasks.core.loss_tokens import LossTokenCounter, load_tokenizer, row_messages
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.monitoring.page.auth import Credentials
from dflash_tasks.monitoring.page.pager import Found, Page, SampleFilter
from dflash_tasks.monitoring.page.run_view import (
    cost_section,
    failure_breakdown,
    gate_shares,
    spent_per_million_trainable,
    yield_sections,
)
from dflash_tasks.monitoring.page.samples_view import list_page, sample_page
from dflash_tasks.monitoring.page.svg import throughput_svg
from dflash_tasks.monitoring.page.trainer_marks import TrainerLens, TrainerSight
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from tests.monitoring.page.records_support import make_record


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("tok"), QWEN3_TEMPLATE)


def definition(view: TrainerView) -> JobDefinition:
    return JobDefinition.create("fp", "in.jsonl", GenerationSpec(model="m"), trainer=view)


def test_marks_agree_with_the_loss_token_count(model_dir: Path) -> None:
    record = make_record("a", reasoning="alpha beta " * 5, answer="beta gamma " * 5)
    for max_length in (4096, 20):
        view = TrainerView(tokenizer=str(model_dir), max_length=max_length)
        counter = LossTokenCounter(load_tokenizer(str(model_dir)), view, True, "t")
        marks = counter.marks(row_messages(record))
        row = counter.count(row_messages(record))
        assert marks.trained_count == row.loss_tokens > 0
        assert len(marks.offsets) == row.tokens
        assert not any(marks.trained[max_length:])


def test_the_sample_view_highlights_trained_tokens_and_shows_the_cut(model_dir: Path) -> None:
    record = make_record("a", reasoning="alpha beta " * 20, answer="beta gamma " * 20)
    view = TrainerView(tokenizer=str(model_dir), max_length=30)
    sight = TrainerLens(view, definition(view)).see(record)
    html = sample_page(Found(0, 0, record), sight)
    assert sight.marks is not None
    trained = re.findall(r"<span class='tok t'>", html)
    assert len(trained) == sight.marks.trained_count
    assert f"data-figure='trained_tokens' data-value='{sight.marks.trained_count}'" in html
    assert "✂ max_length 30" in html and "class='tok cut'" in html


def test_without_a_tokenizer_the_page_says_what_is_missing() -> None:
    record = make_record("a")
    sight = TrainerLens(TrainerView(), definition(TrainerView())).see(record)
    assert sight.marks is None and "no --tokenizer" in sight.note
    html = sample_page(Found(0, 0, record), sight)
    assert "start the page with --tokenizer" in html and "class='tok" not in html
    assert "beta gamma" in html  # the text is still shown


def test_sample_text_is_escaped_everywhere() -> None:
    evil = "<script>alert(1)</script>&'\""
    record = make_record("x<y", prompt=evil, reasoning=evil, answer=evil)
    found = Found(0, 0, record)
    page = sample_page(found, TrainerSight(None, "none"))
    listing = list_page(Page((found,), None, 1, 1), SampleFilter(), {})
    for html in (page, listing):
        assert "<script>" not in html and "&lt;script&gt;" in html
    assert "/samples/x%3Cy?chunk=0" in listing


def test_gate_shares_and_yield_sections_come_from_the_document() -> None:
    doc: dict[str, Any] = {
        "samples": {"done": 200},
        "counters": {"check_truncated": 50, "chunk_seconds": 3.0, "check_empty_answer": 10},
        "trainable_tokens": {"total_loss_tokens": 7},
        "trainable_yield": {"share": 0.5},
        "tokens": {"generated": 1},
    }
    assert gate_shares(doc) == [("empty_answer", 10, 0.05), ("truncated", 50, 0.25)]
    assert [name for name, _ in yield_sections(doc)] == ["trainable_tokens", "trainable_yield"]


def test_the_plot_is_an_svg_of_the_points() -> None:
    svg = throughput_svg([(1000.0, 0.0), (1010.0, 500.0), (1020.0, 250.0)])
    assert svg.startswith("<svg") and svg.count(",") >= 3 and "500" in svg
    assert "fills in" in throughput_svg([])


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials() -> None:
    given = Credentials.from_setting("ann:pw:with:colons")
    assert (given.user, given.password, given.generated) == ("ann", "pw:with:colons", False)
    assert given.allows(basic("ann", "pw:with:colons"))
    for header in (None, "", basic("ann", "wrong"), basic("bob", "pw:with:colons"), "Basic !!!", "Bearer x"):
        assert not given.allows(header)
    made = Credentials.from_setting("")
    assert made.generated and made.user == "admin" and len(made.password) >= 16
    assert made.password not in repr(made)


def test_the_samples_form_keeps_the_source_filter() -> None:
    html = list_page(Page((), None, 0, 0), SampleFilter(source="math<"), {"source": "math<"})
    assert "name='source' value='math&lt;'" in html


def test_failures_by_kind_come_from_each_sources_counted_failures() -> None:
    doc: dict[str, Any] = {
        "sources": {
            "code": {"staged_samples": 10, "failed": 4, "failures": {"permanent": 1, "transient": 3}},
            "math": {"staged_samples": 5},  # not counted by report yet
        }
    }
    html = failure_breakdown(doc)
    assert "data-figure='sources.code.failures.transient' data-value='3'" in html
    assert "data-figure='sources.code.failures.permanent' data-value='1'" in html
    assert "/samples?outcome=failed&amp;source=code" in html
    assert "math" in html and "not counted yet" in html
    none = failure_breakdown({"sources": None})
    assert "data-figure" not in none and "report" in none


def test_cost_per_million_trainable_tokens_needs_both_the_spend_and_the_count() -> None:
    counted = {"counted_samples": 100, "total_loss_tokens": 2_000_000}
    doc: dict[str, Any] = {"samples": {"done": 100}, "cost": {"usd": 5.0}, "trainable_tokens": counted}
    assert spent_per_million_trainable(doc) == pytest.approx(2.5)
    # spend covers 200 done samples, the count 100 of them: the count is scaled to the done ones
    doc["samples"]["done"] = 200
    assert spent_per_million_trainable(doc) == pytest.approx(1.25)
    assert spent_per_million_trainable({**doc, "cost": {"usd": None}}) is None
    assert spent_per_million_trainable({**doc, "trainable_tokens": None}) is None
    zero = {**counted, "total_loss_tokens": 0}
    assert spent_per_million_trainable({**doc, "trainable_tokens": zero}) is None
    cost = {"gpus": 1, "gpu_hours": 1.0, "gpu_hour_usd": 5.0, "usd": 5.0, "projected_total_usd": 9.0}
    shown = cost_section({**doc, "cost": cost})
    assert "data-figure='cost_per_million_trainable_usd' data-value='1.25'" in shown
    assert "not counted yet" in cost_section({**doc, "cost": cost, "trainable_tokens": None})


def test_the_live_yields_cost_per_million_trainable_tokens_comes_first() -> None:
    counted = {"counted_samples": 100, "total_loss_tokens": 2_000_000}
    doc: dict[str, Any] = {"samples": {"done": 100}, "cost": {"usd": 5.0}, "trainable_tokens": counted}
    live = {"yield": 0.9, "usd_per_million_trainable": 3.75, "where_the_rest_went": {"failed_turns": 1}}
    assert spent_per_million_trainable({**doc, "yield": live}) == 3.75
    assert spent_per_million_trainable({**doc, "yield": None}) == pytest.approx(2.5)  # none counted live
    cost = {"gpus": 1, "gpu_hours": 1.0, "gpu_hour_usd": 5.0, "usd": 5.0, "projected_total_usd": 9.0}
    shown = cost_section({**doc, "cost": cost, "yield": live})
    assert "data-figure='cost_per_million_trainable_usd' data-value='3.75'" in shown
