"""Each request's budget under ``--max-tokens horizon``, from the served model's tokenizer
(workers/generate/request_budget.py): the row's prefix as the trainer renders it, in the export's layout."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.job import GenerationSpec, JobDefinition
from dflash_tasks.core.loss_tokens import load_tokenizer
from dflash_tasks.core.trainer_view import TrainerView
from tests.core.test_record import turn
from tests.exact_tokenizer import build_exact_model_dir
from workers.checks.loss_counting import LossCountCache
from workers.generate.request_budget import request_budget
from workers.sglang_client import ServerIdentity

MAX_LENGTH = 300
SYSTEM = {"role": "system", "content": "You are terse."}
Q1 = {"role": "user", "content": "What is two plus two?"}
Q2 = {"role": "user", "content": "And times three?"}
REASONING = " ".join(["okay let me think about this carefully"] * 6)


def job(history: str = "drop", policy: str = "horizon", template: str | None = None) -> JobDefinition:
    spec = GenerationSpec("Qwen3-8B", max_tokens=MAX_LENGTH, history_reasoning=history, budget_policy=policy)
    return JobDefinition.create(
        "sha256:x", "in.jsonl", spec, trainer=TrainerView(max_length=MAX_LENGTH, template=template)
    )


def served(model: Path | str) -> ServerIdentity:
    return ServerIdentity(str(model), "Qwen3-8B", "0.5.23")


def prompt_tokens(model: Path, messages: list[dict[str, Any]], **kwargs: Any) -> int:
    tokenizer = load_tokenizer(str(model))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_first_turns_budget_is_max_length_less_its_prompt_plus_the_closing_tokens(tmp_path: Path) -> None:
    model = build_exact_model_dir(tmp_path)
    budget = request_budget(LossCountCache(), "j", job(), served(model))
    assert budget is not None and budget.closing == 2
    expected = MAX_LENGTH - prompt_tokens(model, [SYSTEM, Q1], enable_thinking=True) + 2
    assert budget([[SYSTEM, Q1], [Q2]], []) == expected


def test_a_later_turns_prefix_is_the_row_the_export_writes(tmp_path: Path) -> None:
    model = build_exact_model_dir(tmp_path)
    answered = [turn(input=(SYSTEM, Q1), reasoning=REASONING, content="Four.")]
    inputs = [[SYSTEM, Q1], [Q2]]
    history = [SYSTEM, Q1, {"role": "assistant", "content": "Four."}, Q2]
    # Qwen3's rules leave an earlier turn's reasoning untrained: per-turn rows, without it.
    dropped = request_budget(LossCountCache(), "j", job(), served(model))
    assert dropped is not None and dropped.per_turn
    assert dropped(inputs, answered) == MAX_LENGTH - prompt_tokens(model, history, enable_thinking=True) + 2
    # history_reasoning keep: the template renders (and trains) it; whole conversations, with it.
    kept = request_budget(LossCountCache(), "j", job("keep"), served(model))
    assert kept is not None and not kept.per_turn
    with_reasoning = [*history[:2], {**history[2], "reasoning_content": REASONING}, Q2]
    full = prompt_tokens(model, with_reasoning, enable_thinking=True, preserve_thinking=True)
    assert kept(inputs, answered) == MAX_LENGTH - full + 2
    assert kept(inputs, answered) < dropped(inputs, answered) - 40  # the reasoning's ~42 tokens


def test_the_trainers_registered_template_adds_its_system_prompt_to_the_prefix(tmp_path: Path) -> None:
    model = build_exact_model_dir(tmp_path)
    own = request_budget(LossCountCache(), "j", job(), served(model))
    specforge = request_budget(LossCountCache(), "j", job(template="qwen3-thinking"), served(model))
    assert own is not None and specforge is not None
    # SpecForge renders its system prompt first, which the server's prompt never had
    system = {"role": "system", "content": "You are a helpful assistant."}
    added = prompt_tokens(model, [system, Q1], enable_thinking=True) - prompt_tokens(
        model, [Q1], enable_thinking=True
    )
    assert added == 10 and own([[Q1]], []) - specforge([[Q1]], []) == added


def test_a_prefix_past_max_length_gets_the_floor(tmp_path: Path) -> None:
    model = build_exact_model_dir(tmp_path)
    budget = request_budget(LossCountCache(), "j", job(), served(model))
    assert budget is not None
    assert budget([[{"role": "user", "content": "word " * 400}]], []) == 16


def test_a_fixed_budget_job_gets_none(tmp_path: Path) -> None:
    model = build_exact_model_dir(tmp_path)
    assert request_budget(LossCountCache(), "j", job(policy="fixed"), served(model)) is None


def test_without_a_readable_tokenizer_each_request_gets_max_length_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = LossCountCache()
    with caplog.at_level(logging.WARNING, logger="workers.generate.request_budget"):
        for _ in range(3):
            assert request_budget(cache, "job-x", job(), served("Qwen/Qwen3-8B")) is None
            assert request_budget(cache, "job-x", job(), None) is None
    said = [r.getMessage() for r in caplog.records if "job-x" in r.getMessage()]
    assert len(said) == 1 and f"the fixed budget {MAX_LENGTH}" in said[0]


def test_a_prefix_the_template_refuses_gets_the_fallback_said_once_per_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_exact_model_dir(tmp_path)
    budget = request_budget(LossCountCache(), "job-refused", job(), served(model))
    assert budget is not None

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise ValueError("the template refuses these messages")

    monkeypatch.setattr(budget.counter, "prompt_tokens", refuse)
    with caplog.at_level(logging.WARNING, logger="workers.generate.request_budget"):
        assert [budget([[SYSTEM, Q1]], []) for _ in range(5)] == [MAX_LENGTH] * 5
    said = [r.getMessage() for r in caplog.records if "job-refused" in r.getMessage()]
    assert len(said) == 1 and "ValueError" in said[0] and "max_tokens 300" in said[0]
