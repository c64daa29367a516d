"""The trainer's flags (``--tokenizer``, ``--train-*``): how the drafter trainer will read the rows,
over the view the job recorded (:class:`dflash_tasks.core.trainer_view.TrainerView`)."""

from __future__ import annotations

import argparse

from dflash_tasks.core.trainer_templates import REGISTERED
from dflash_tasks.core.trainer_view import DEFAULT_TRAIN_MAX_LENGTH, TrainerOverrides, TrainerView


def add_trainer_flags(parser: argparse.ArgumentParser) -> None:
    """``--tokenizer``, ``--train-max-length``, ``--train-last-turn-only``, ``--train-template``."""
    g = parser.add_argument_group("trainer (loss tokens)")
    g.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the model directory (tokenizer.json, tokenizer_config.json with its chat template) the "
        "trainer uses; default: the job's, else the served model's path when readable here",
    )
    g.add_argument(
        "--train-max-length",
        type=int,
        metavar="N",
        help=f"the trainer's max_length (default: the job's, else {DEFAULT_TRAIN_MAX_LENGTH:,})",
    )
    g.add_argument(
        "--train-last-turn-only",
        action="store_true",
        default=None,
        help="the trainer learns from the last assistant turn only (train_only_last_turn)",
    )
    g.add_argument(
        "--train-template",
        choices=sorted(REGISTERED),
        help="SpecForge's registered chat template the trainer marks loss spans with (its "
        "--chat-template; qwen3.5 for Qwen3.5/3.6); default: the job's, else the markers of the "
        "tokenizer's own template",
    )


def overrides_from_args(args: argparse.Namespace) -> TrainerOverrides:
    """The trainer flags ``args`` gives (a command without them: none)."""
    return TrainerOverrides(
        tokenizer=getattr(args, "tokenizer", None),
        max_length=getattr(args, "train_max_length", None),
        last_turn_only=bool(getattr(args, "train_last_turn_only", None)),
        template=getattr(args, "train_template", None),
    )


def view_from_args(args: argparse.Namespace, recorded: TrainerView | None = None) -> TrainerView:
    """The view the flags ask for, on top of ``recorded`` (the job's) or the defaults."""
    return overrides_from_args(args).on(recorded)
