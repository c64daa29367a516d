"""The enqueue command's generation flags: their defaults are the job spec's, not a second copy; and
the loop rule's flag, which takes the values of its variable."""

from __future__ import annotations

import pytest

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.on_loop import OnLoop
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.producer.enqueue_args import build_parser, quality_from_args, spec_from_args


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


# --- the loop detection's thresholds: --repetition and DFLASH_REPETITION take the same values ---------

JOB = ["--input", "p", "--output", "o", "--model", "M"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("off", RepetitionSettings(enabled=False)),
        ("min_chars=2400,max_period=6000", RepetitionSettings(min_chars=2400, max_period=6000)),
        ("on,min_repeats=3", RepetitionSettings(min_repeats=3)),
    ],
)
def test_the_flag_and_the_variable_set_the_jobs_loop_rule(value: str, expected: RepetitionSettings) -> None:
    by_flag = quality_from_args(build_parser().parse_args([*JOB, "--repetition", value]))
    settings = ProducerSettings.load({"DFLASH_REPETITION": value})
    by_variable = quality_from_args(build_parser().parse_args(JOB), settings.repetition)
    assert by_flag.repetition == by_variable.repetition == expected
    assert quality_from_args(build_parser().parse_args(JOB)).repetition == RepetitionSettings()


def test_the_flag_wins_over_the_variable() -> None:
    args = build_parser().parse_args([*JOB, "--repetition", "min_chars=3000"])
    assert quality_from_args(args, "off").repetition == RepetitionSettings(min_chars=3000)


def test_a_bad_loop_rule_names_the_flag_or_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # the flag parses as its variable does: refused at once
        build_parser().parse_args([*JOB, "--repetition", "min_chars=x"])
    assert "argument --repetition: 'min_chars=x'" in capsys.readouterr().err
    args = build_parser().parse_args(JOB)
    args.repetition = "min_chars=x"  # a rule that reached quality_from_args some other way
    with pytest.raises(ConfigError, match="--repetition 'min_chars=x'"):
        quality_from_args(args)
    with pytest.raises(ConfigError, match="DFLASH_REPETITION='sometimes'"):
        ProducerSettings.load({"DFLASH_REPETITION": "sometimes"})


def test_max_tokens_horizon_records_the_policy_and_the_trainers_max_length() -> None:
    base = ["--input", "p", "--output", "o", "--model", "M"]
    spec = spec_from_args(build_parser().parse_args([*base, "--max-tokens", "horizon"]), None, 8192)
    assert spec == GenerationSpec(model="M", max_tokens=8192, budget_policy="horizon")
    # DFLASH_MAX_TOKENS (the settings' value) where the flag is not given; the flag over it
    from_env = spec_from_args(build_parser().parse_args(base), "horizon", 2048)
    assert (from_env.budget_policy, from_env.max_tokens) == ("horizon", 2048)
    flag = spec_from_args(build_parser().parse_args([*base, "--max-tokens", "300"]), "horizon", 2048)
    assert (flag.budget_policy, flag.max_tokens) == ("fixed", 300)
    assert spec_from_args(build_parser().parse_args(base), 1000, 2048).max_tokens == 1000


# --- what happens to a looped sample: --on-loop and DFLASH_ON_LOOP take the same values --------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("drop", OnLoop("drop")), ("prefix", OnLoop("prefix")), ("prefix=2048", OnLoop("prefix", 2048))],
)
def test_the_flag_and_the_variable_set_the_jobs_on_loop_policy(value: str, expected: OnLoop) -> None:
    by_flag = quality_from_args(build_parser().parse_args([*JOB, "--on-loop", value]))
    settings = ProducerSettings.load({"DFLASH_ON_LOOP": value})
    by_variable = quality_from_args(build_parser().parse_args(JOB), "", settings.on_loop)
    assert by_flag.on_loop == by_variable.on_loop == expected
    assert quality_from_args(build_parser().parse_args(JOB)).on_loop == OnLoop("regenerate")
    over = quality_from_args(build_parser().parse_args([*JOB, "--on-loop", value]), "", "regenerate")
    assert over.on_loop == expected  # the flag wins


def test_a_bad_on_loop_policy_names_the_flag_or_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*JOB, "--on-loop", "retry"])
    assert "argument --on-loop: 'retry'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="DFLASH_ON_LOOP='drop=3'"):
        ProducerSettings.load({"DFLASH_ON_LOOP": "drop=3"})
