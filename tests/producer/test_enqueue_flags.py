"""The enqueue command's generation flags: their defaults are the job spec's, not a second copy."""

from __future__ import annotations

import pytest

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.producer.enqueue import build_parser, spec_from_args


def test_no_generation_flag_gives_the_job_specs_defaults() -> None:
    args = build_parser().parse_args(["--input", "p.jsonl", "--output", "out", "--model", "Qwen3-8B"])
    assert spec_from_args(args) == GenerationSpec(model="Qwen3-8B")


def test_flags_override_the_spec_defaults() -> None:
    argv = ["--input", "p", "--output", "o", "--model", "M", "--max-tokens", "512", "--top-k", "-1"]
    argv += ["--chunk-size", "8", "--turns", "last", "--no-thinking"]
    spec = spec_from_args(build_parser().parse_args(argv))
    assert (spec.max_tokens, spec.top_k, spec.chunk_size, spec.turns, spec.thinking) == (
        512,
        -1,
        8,
        "last",
        False,
    )


def test_a_bad_flag_value_names_the_flag() -> None:
    args = build_parser().parse_args(["--input", "p", "--output", "o", "--model", "M", "--chunk-size", "0"])
    with pytest.raises(ConfigError, match="--chunk-size must be >= 1"):
        spec_from_args(args)
