"""The trainer view: recorded in job.json, overridden by a command's flags, old job files readable."""

from __future__ import annotations

import argparse
import json

import pytest

from dflash_tasks.cli.trainer_flags import add_trainer_flags, view_from_args
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import GenerationSpec, JobDefinition
from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.trainer_view import TrainerView


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_trainer_flags(p)
    return p.parse_args(argv)


def test_flags_override_the_recorded_view_one_field_at_a_time() -> None:
    recorded = TrainerView(tokenizer="/models/q", max_length=512, last_turn_only=False)
    assert view_from_args(parse(), recorded) == recorded
    assert view_from_args(parse("--train-max-length", "8192"), recorded) == TrainerView("/models/q", 8192)
    assert view_from_args(parse("--train-last-turn-only", "--tokenizer", "/t")) == TrainerView(
        "/t", 4096, True
    )
    with pytest.raises(ConfigError, match="--train-max-length must be >= 1, got 0"):
        view_from_args(parse("--train-max-length", "0"))


def test_job_json_records_the_view_and_the_thresholds_and_reads_old_files() -> None:
    quality = QualitySettings(min_loss_tokens=16)
    job = JobDefinition.create("sha256:x", "in", GenerationSpec(model="m"), quality, TrainerView("/t", 2048))
    doc = json.loads(job.to_json())
    assert doc["trainer"] == {"tokenizer": "/t", "max_length": 2048, "last_turn_only": False}
    assert doc["quality"]["min_loss_tokens"] == 16
    assert doc["quality"]["max_share"]["truncated_by_trainer"] == 0.30
    back = JobDefinition.from_json(job.to_json(), "job.json")
    assert back.trainer == job.trainer and back.quality == job.quality
    assert (
        back.job_id == JobDefinition.create("sha256:x", "in", GenerationSpec(model="m")).job_id
    )  # not identity
    del doc["trainer"], doc["quality"]["min_loss_tokens"], doc["quality"]["max_share"]["few_loss_tokens"]
    old = JobDefinition.from_json(json.dumps(doc).encode(), "job.json")  # written before this change
    assert old.trainer == TrainerView() and old.quality.max_share["few_loss_tokens"] == 0.10


def test_the_trainers_registered_template_is_a_flag_recorded_in_job_json() -> None:
    view = view_from_args(parse("--train-template", "qwen3.5"), TrainerView("/t", 2048))
    assert view == TrainerView("/t", 2048, template="qwen3.5")
    job = JobDefinition.create("sha256:x", "in", GenerationSpec(model="m"), None, view)
    assert json.loads(job.to_json())["trainer"]["template"] == "qwen3.5"
    assert JobDefinition.from_json(job.to_json(), "job.json").trainer == view
    with pytest.raises(ConfigError, match="--train-template 'qwen9': not a template this project knows"):
        TrainerView(template="qwen9")
