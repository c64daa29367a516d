"""The trainer's gates (``few_loss_tokens``, ``truncated_by_trainer``) on rows of known loss tokens,
in ``report`` and the preflight alike: where a row is few, and what each share is taken over.

Two ok samples, planned as two rows under a tiny Qwen3 tokenizer: one of 19 loss tokens, one of
129 that ``max_length`` 100 cuts (83 kept), beside ten samples that failed for good (judged by the
``failed`` gate, never planned as rows). The trainer's shares are over the two counted rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import GenerationSpec, JobDefinition, output_key
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.output.report import build_report
from dflash_tasks.producer.preflight import judge
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from dflash_tasks.store import LocalStore

SHORT_LOSS_TOKENS = 19  # the short row's, under the tiny tokenizer and Qwen3's template
MAX_LENGTH = 100  # fits the short row whole, cuts the long one
FAILED = 10


def ok(i: int, reasoning_words: int) -> dict[str, Any]:
    return {
        "id": f"s{i}",
        "source": "a",
        "messages": [{"role": "user", "content": "alpha"}],
        "reasoning": " ".join(["beta gamma"] * reasoning_words),
        "content": "gamma delta",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 300, "reasoning_tokens": 250},
        "status": "ok",
        "checks": [],
    }


def failed(i: int) -> dict[str, Any]:
    turn = {"status": "failed", "error": "HTTP 400: too long", "failure": "permanent", "latency_s": 1.0}
    return {
        "id": f"s{i}",
        "source": "a",
        "status": "failed",
        "failure": "permanent",
        "turns": [turn],
        "checks": ["failed"],
    }


RECORDS = [ok(0, 5), ok(1, 60), *(failed(i) for i in range(2, 2 + FAILED))]


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> TrainerView:
    model = build_model_dir(tmp_path_factory.mktemp("model"), QWEN3_TEMPLATE)
    return TrainerView(tokenizer=str(model), max_length=MAX_LENGTH)


def job(min_loss_tokens: int) -> JobDefinition:
    return JobDefinition.create(
        "sha256:x", "in.jsonl", GenerationSpec(model="m"), QualitySettings(min_loss_tokens=min_loss_tokens)
    )


def records() -> list[Record]:
    return [Record.from_dict(r) for r in RECORDS]


def test_the_rows_are_what_the_gates_below_assume(view: TrainerView) -> None:
    report = build_report(job(1), records(), 1, 1, view)
    assert report.trainable is not None
    assert sorted(report.trainable.loss_tokens) == [SHORT_LOSS_TOKENS, 83]
    assert (report.trainable.samples, report.trainable.truncated, report.samples) == (2, 1, 2 + FAILED)


@pytest.mark.parametrize(("min_loss_tokens", "few"), [(SHORT_LOSS_TOKENS, 0), (SHORT_LOSS_TOKENS + 1, 1)])
def test_a_row_with_exactly_min_loss_tokens_is_not_few(
    view: TrainerView, min_loss_tokens: int, few: int
) -> None:
    report = build_report(job(min_loss_tokens), records(), 1, 1, view)
    assert report.trainable is not None and report.trainable.few == few
    assert report.sources.to_dict()["a"]["few_loss_tokens"] == few  # the per-source count too


def gates(failures: list[tuple[str, float]]) -> dict[str, float]:
    return {check: round(share, 3) for check, share in failures}


def test_reports_trainer_shares_are_over_the_counted_rows(view: TrainerView) -> None:
    report = build_report(job(SHORT_LOSS_TOKENS + 1), records(), 1, 1, view)
    # 1 of the 2 counted rows each: 50%; over all 12 samples they would be 8%, under both limits
    assert "50% of samples have fewer than the minimum loss tokens under the chat template" in " ".join(
        report.gate_failures
    )
    assert "50% of samples lose loss tokens to the trainer's max_length" in " ".join(report.gate_failures)


@pytest.mark.parametrize("planned", [True, False], ids=["planned rows", "records counted"])
def test_the_preflights_trainer_shares_are_over_the_counted_rows(
    tmp_path: Path, view: TrainerView, planned: bool
) -> None:
    store = LocalStore(tmp_path)
    store.write(output_key(0), b"".join(r.to_json().encode() + b"\n" for r in records()))
    the_job = job(SHORT_LOSS_TOKENS + 1)
    report = judge(
        store,
        [0],
        the_job.quality,
        10.0,
        slots=4,
        workers=1,
        remaining=100,
        gpu_hour_usd=0.0,
        trainer=view,
        job=the_job if planned else None,
    )
    assert report.samples == 2 + FAILED and report.trainable is not None and report.trainable.samples == 2
    shares = gates([(f.check, f.share) for f in report.failures])
    assert shares == {"failed": round(FAILED / 12, 3), "few_loss_tokens": 0.5, "truncated_by_trainer": 0.5}
