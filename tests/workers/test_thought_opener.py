"""The continuation's opener, read from the served model's chat template on the worker's disk."""

from __future__ import annotations

from pathlib import Path

from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from workers.generate.thought_opener import thought_opener

#: Qwen3.5/3.6's generation prompt with thinking on: the template opens the thought itself.
OPENS_THE_THOUGHT = QWEN3_TEMPLATE.replace(
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if not (enable_thinking is defined and enable_thinking is false) -%}"
    "{{- '<think>\\n' -}}{%- endif -%}",
)


def test_the_opener_is_what_the_model_writes_before_its_thought(tmp_path: Path) -> None:
    assert OPENS_THE_THOUGHT != QWEN3_TEMPLATE
    qwen3 = build_model_dir(tmp_path, QWEN3_TEMPLATE, "qwen3")
    qwen36 = build_model_dir(tmp_path, OPENS_THE_THOUGHT, "qwen36")
    assert thought_opener(str(qwen3)) == "<think>\n"  # the model writes it
    assert thought_opener(str(qwen36)) == ""  # the prompt already ends in it


def test_an_unreadable_model_path_falls_back_to_qwen3s_opener(tmp_path: Path) -> None:
    assert thought_opener(str(tmp_path / "absent")) == "<think>\n"
    assert thought_opener("Qwen/Qwen3-8B") == "<think>\n"  # a hub id: nothing to read here
    assert thought_opener(None) == "<think>\n"
