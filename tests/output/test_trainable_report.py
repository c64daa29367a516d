"""The report's trainer view: loss-token distribution, total, gates and picture, from known rows."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import GenerationSpec, JobDefinition
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.output.report import build_report, render_png, render_text
from dflash_tasks.sim.tokenizer import PLAIN_TEMPLATE, QWEN3_TEMPLATE, build_model_dir

JOB = JobDefinition.create(
    "sha256:x", "in.jsonl", GenerationSpec(model="m"), QualitySettings(min_loss_tokens=8)
)


def record(i: int, reasoning_words: int, served: str | None = None) -> Record:
    return Record.from_dict(
        {
            "id": f"s{i}",
            "messages": [{"role": "user", "content": "alpha"}],
            "reasoning": " ".join(["beta gamma"] * reasoning_words),
            "content": "gamma delta",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 5, "completion_tokens": 300, "reasoning_tokens": 250},
            "status": "ok",
            "server": None if served is None else {"model_path": served},
            "checks": [],
        }
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {
        "qwen3": str(build_model_dir(root, QWEN3_TEMPLATE)),
        "plain": str(build_model_dir(root, PLAIN_TEMPLATE, "plain")),
    }


def test_loss_tokens_of_known_rows_in_the_text_and_the_picture(models: dict[str, str]) -> None:
    # "beta gamma" n times: beta Ġgamma (Ġbeta Ġgamma)...: 2n tokens; the rest of each row is the same
    records = [record(i, n, served=models["qwen3"]) for i, n in enumerate((1, 5, 10))]
    report = build_report(JOB, records, 1, 1, TrainerView())
    assert report.trainable is not None
    per_row = sorted(report.trainable.loss_tokens)
    assert [b - a for a, b in itertools.pairwise(per_row)] == [8, 10]  # 2 tokens per word pair
    assert report.trainable.total == sum(per_row) and report.trainable.few == 0
    assert "the served model's path, from /model_info" in report.trainer_note
    text = render_text(report)
    assert f"loss tokens       total {sum(per_row):,} over 3 samples" in text and "gates passed" in text
    png = render_png(report)
    assert png.startswith(b"\x89PNG")
    from PIL import Image

    assert Image.open(io.BytesIO(png)).size == (2100, 400)  # four panels


def test_a_template_that_drops_the_reasoning_trips_few_loss_tokens(models: dict[str, str]) -> None:
    records = [record(i, 50) for i in range(4)]
    report = build_report(JOB, records, 1, 1, TrainerView(tokenizer=models["plain"]))
    assert report.trainable is not None and report.trainable.few == 4
    assert report.trainable.reasoning_dropped == 4
    assert any("100% of samples have fewer than the minimum loss tokens" in m for m in report.gate_failures)
    assert "4 of 4 assistant turns' reasoning is not rendered by the chat template" in render_text(report)


def test_max_length_cuts_show_in_the_report(models: dict[str, str]) -> None:
    records: list[Any] = [record(i, 100, served=models["qwen3"]) for i in range(3)]
    report = build_report(JOB, records, 1, 1, TrainerView(max_length=64))
    assert report.trainable is not None and report.trainable.truncated == 3
    assert any("lose loss tokens to the trainer's max_length" in m for m in report.gate_failures)


def test_without_a_tokenizer_the_report_says_why(tmp_path: Path) -> None:
    report = build_report(JOB, [record(0, 3, served=str(tmp_path / "elsewhere"))], 1, 1, TrainerView())
    assert report.trainable is None
    assert report.trainer_note == (
        f"loss tokens not counted: no --tokenizer, and the served model path {tmp_path / 'elsewhere'} "
        "is not readable here"
    )
    assert "not counted (no tokenizer)" not in render_text(report)  # the panel says it, the text the note
    assert render_png(report).startswith(b"\x89PNG")
