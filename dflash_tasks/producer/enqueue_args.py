"""The ``enqueue`` command line: its flags, and the job spec and quality settings they make."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_setting, broker_flags, json_flag, store_flags
from dflash_tasks.cli.trainer_flags import add_trainer_flags, overrides_from_args
from dflash_tasks.core.budget import FIXED, HORIZON
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.job import HISTORY_REASONING, TURNS_MODES, GenerationSpec
from dflash_tasks.core.model_name import check_model_name
from dflash_tasks.core.on_loop import ON_LOOP_HELP, OnLoop
from dflash_tasks.core.quality import GATES, QualitySettings
from dflash_tasks.core.repetition import SPEC_HELP, RepetitionSettings
from dflash_tasks.core.settings import ProducerSettings
from dflash_tasks.core.trainer_view import DEFAULT_TRAIN_MAX_LENGTH
from dflash_tasks.producer.enqueue_options import DEFAULT_PREFLIGHT, EnqueueOptions
from dflash_tasks.producer.prompt_row import ColumnMap

DESCRIPTION = "stage a prompt file and queue one task per chunk"

#: GenerationSpec's defaults, which the flags show and use.
_SPEC_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(GenerationSpec) if f.default is not dataclasses.MISSING
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.enqueue"),
        description=DESCRIPTION,
        parents=[
            store_flags(output_help="output root: a directory or s3://bucket/prefix"),
            broker_flags(),
            json_flag("print one JSON summary as the last line"),
        ],
    )
    p.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="LOCATION[,key=value...]",
        help="prompts: a JSONL file (plain, .gz, .zst), a Parquet file, folder or glob, a Hugging Face "
        "save_to_disk folder or Hub snapshot, local or s3://; repeat for several sources. Keys: "
        "name=, weight= (share of the mix), limit= (rows), format=jsonl|parquet|arrow, and "
        "messages=, prompt=, id= (columns, over the flags below)",
    )
    add_column_flags(p)
    add_spec_flags(p)
    add_run_flags(p)
    add_quality_flags(p)
    add_trainer_flags(p)
    return p


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The job's generation spec: the model, sampling, chunking and turns."""
    p.add_argument(
        "--model", help="the model's served name or the last part of its path, e.g. Qwen3-8B (required)"
    )
    spec = _SPEC_DEFAULTS  # the job spec holds the only defaults
    add_setting(
        p,
        "--max-tokens",
        ProducerSettings,
        "max_tokens",
        f"completion budget of each request (default {spec['max_tokens']}); horizon: the trainer's "
        "--train-max-length less the request's row prefix, so nothing past what the trainer sees is "
        "paid for",
        metavar="N|horizon",
    )
    p.add_argument("--temperature", type=float, default=spec["temperature"], help="default %(default)s")
    p.add_argument("--top-p", type=float, default=spec["top_p"], help="default %(default)s")
    p.add_argument("--top-k", type=int, default=spec["top_k"], help="default %(default)s")
    p.add_argument("--no-thinking", action="store_true", help="generate without thinking mode")
    p.add_argument(
        "--chunk-size", type=int, default=spec["chunk_size"], help="prompts per task (default %(default)s)"
    )
    p.add_argument(
        "--turns",
        choices=TURNS_MODES,
        default=spec["turns"],
        help="all (default): regenerate every assistant turn in order from the model's own answers; "
        "last: send the source's history as is and regenerate the last turn only",
    )
    p.add_argument(
        "--history-reasoning",
        choices=HISTORY_REASONING,
        default=spec["history_reasoning"],
        help="drop (default): a turn's request carries the earlier answers only; keep: their reasoning "
        "too, rendered with preserve_thinking (Qwen3.6), and so counted in the loss tokens",
    )


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """This run: wait or not, repair what, or only plan."""
    p.add_argument("--wait", action="store_true", help="show a progress bar until the job is finished")
    add_setting(
        p,
        "--wait-replan-seconds",
        ProducerSettings,
        "wait_replan_seconds",
        "with --wait: re-plan from the store this often (default 60)",
        aliases=["--replan-seconds"],
        metavar="SECONDS",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="repair rounds also regenerate samples that failed permanently (e.g. after raising the "
        "server's context length); nothing else about the job changes",
    )
    p.add_argument(
        "--repair-truncated",
        action="store_true",
        help="with --max-tokens N (above the job's): repair rounds regenerate the samples truncated at "
        "max_tokens with budget N, recorded in job.json as an amendment (the job keeps its id)",
    )
    p.add_argument("--dry-run", action="store_true", help="plan and print; write and queue nothing")


def add_quality_flags(p: argparse.ArgumentParser) -> None:
    """The preflight and the quality gates, with the price for its cost projections."""
    q = p.add_argument_group("quality")
    q.add_argument(
        "--preflight",
        type=int,
        default=DEFAULT_PREFLIGHT,
        metavar="N",
        help=f"preflight sample size (default {DEFAULT_PREFLIGHT})",
    )
    q.add_argument("--no-preflight", action="store_true", help="queue the whole job at once")
    add_setting(
        q,
        "--preflight-timeout-seconds",
        ProducerSettings,
        "preflight_timeout_seconds",
        "time to wait for the preflight (default 3600)",
        aliases=["--preflight-timeout"],
        metavar="SECONDS",
    )
    add_setting(
        q,
        "--gpu-hour-usd",
        ProducerSettings,
        "gpu_hour_usd",
        "price of one GPU-hour, for cost projections",
        metavar="X",
    )
    q.add_argument(
        "--min-completion-tokens", type=int, help="flag completions shorter than this (default 32)"
    )
    q.add_argument(
        "--max-share",
        action="append",
        default=[],
        metavar="CHECK=SHARE",
        help=f"gate threshold per check, e.g. no_reasoning=0.05; checks: {', '.join(GATES)}",
    )
    q.add_argument(
        "--min-loss-tokens",
        type=int,
        help="a row with fewer loss tokens counts toward the few_loss_tokens gate (default 64)",
    )
    add_setting(q, "--repetition", ProducerSettings, "repetition", SPEC_HELP, metavar="SPEC")
    add_setting(q, "--on-loop", ProducerSettings, "on_loop", ON_LOOP_HELP, metavar="POLICY")


def add_column_flags(p: argparse.ArgumentParser) -> None:
    """The flags naming which columns hold a row's prompt and id (enqueue and verify)."""
    c = p.add_argument_group("input columns (default: messages, conversations or prompt; id)")
    c.add_argument(
        "--messages-column", metavar="COL", help="a column of chat turns (role/content or from/value)"
    )
    c.add_argument("--prompt-column", metavar="COL", help="a column of user text, one turn")
    c.add_argument(
        "--id-column", metavar="COL", help="the column naming each sample (default: id, when present)"
    )
    c.add_argument("--system-prompt", metavar="TEXT", help="a system turn put first where a row has none")
    c.add_argument(
        "--sample-seed",
        type=int,
        default=0,
        help="seed choosing the rows of sources with weight= or limit= (default 0)",
    )


def columns_from_args(args: argparse.Namespace) -> ColumnMap:
    try:
        return ColumnMap(args.messages_column, args.prompt_column, args.id_column, args.system_prompt)
    except ValueError as exc:
        raise ConfigError(f"--messages-column, --prompt-column: {exc}") from None


def spec_from_args(
    args: argparse.Namespace, max_tokens: int | str | None = None, max_length: int | None = None
) -> GenerationSpec:
    """The job spec the flags ask for. ``max_tokens``: the budget when ``--max-tokens`` is not given
    (``DFLASH_MAX_TOKENS``; default the spec's); under ``horizon`` the spec's ``max_tokens`` is the
    trainer's ``max_length``."""
    check_model_name(args.model or "")
    value = args.max_tokens if args.max_tokens is not None else max_tokens
    value = _SPEC_DEFAULTS["max_tokens"] if value is None else value
    if value == HORIZON:
        policy, budget = HORIZON, max_length or DEFAULT_TRAIN_MAX_LENGTH
    else:
        policy, budget = FIXED, int(value)
    checks = [
        (budget >= 1, f"--max-tokens must be >= 1, got {budget}"),
        (args.temperature >= 0, f"--temperature must be >= 0, got {args.temperature}"),
        (0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}"),
        (args.top_k == -1 or args.top_k >= 1, f"--top-k must be -1 or >= 1, got {args.top_k}"),
        (args.chunk_size >= 1, f"--chunk-size must be >= 1, got {args.chunk_size}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    return GenerationSpec(
        model=args.model,
        max_tokens=budget,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        thinking=not args.no_thinking,
        chunk_size=args.chunk_size,
        turns=args.turns,
        history_reasoning=args.history_reasoning,
        budget_policy=policy,
    )


def quality_from_args(args: argparse.Namespace, repetition: str = "", on_loop: str = "") -> QualitySettings:
    """The job's quality settings from the flags; ``repetition``: ``DFLASH_REPETITION``, which
    ``--repetition`` overrides; ``on_loop``: ``DFLASH_ON_LOOP``, which ``--on-loop`` overrides."""
    base = QualitySettings()
    shares = dict(base.max_share)
    for item in args.max_share:
        name, sep, value = item.partition("=")
        if not sep or name not in GATES:
            raise ConfigError(
                f"--max-share {item!r}: expected CHECK=SHARE with CHECK one of {', '.join(GATES)}"
            )
        try:
            shares[name] = float(value)
        except ValueError:
            raise ConfigError(f"--max-share {item!r}: {value!r} is not a number") from None
    minimum = base.min_completion_tokens if args.min_completion_tokens is None else args.min_completion_tokens
    loss = base.min_loss_tokens if args.min_loss_tokens is None else args.min_loss_tokens
    spec = args.repetition or repetition
    try:
        loops = RepetitionSettings.parse(spec)
    except ValueError as exc:
        raise ConfigError(f"--repetition {spec!r}: {exc}") from None
    policy = args.on_loop or on_loop
    try:
        looped = OnLoop.parse(policy)
    except ValueError as exc:
        raise ConfigError(f"--on-loop {policy!r}: {exc}") from None
    return QualitySettings(
        min_completion_tokens=minimum,
        max_share=shares,
        min_loss_tokens=loss,
        repetition=loops,
        on_loop=looped,
    )


def options_from_args(args: argparse.Namespace, settings: ProducerSettings | None = None) -> EnqueueOptions:
    """The run the flags ask for, over ``settings``' ``DFLASH_MAX_TOKENS``, ``DFLASH_REPETITION`` and
    ``DFLASH_ON_LOOP``; :class:`ConfigError` naming a bad flag. Under ``--max-tokens horizon`` the
    spec's ``max_tokens`` is the trainer's ``max_length`` of the flags (``prepare`` takes the job's
    where it has one)."""
    overrides = overrides_from_args(args)
    return EnqueueOptions(
        inputs=tuple(args.input),
        output=args.output,
        spec=spec_from_args(args, settings.max_tokens if settings else None, overrides.on().max_length),
        quality=quality_from_args(
            args, settings.repetition if settings else "", settings.on_loop if settings else ""
        ),
        trainer=overrides,
        columns=columns_from_args(args),
        sample_seed=args.sample_seed,
        preflight=0 if args.no_preflight else args.preflight,
        wait=args.wait,
        dry_run=args.dry_run,
        retry_failed=args.retry_failed,
        repair_truncated=args.repair_truncated,
    )
