"""How the drafter trainer will read the exported rows: its tokenizer, ``max_length`` and turns.

Recorded in ``job.json`` (``trainer``) when the job is made; ``enqueue``, ``report`` and
``export`` take the same flags, which override the recorded view for that one command (a
re-run after a failed preflight can fix ``--train-max-length`` without changing the job).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from dflash_tasks.core.errors import ConfigError

#: The trainer's ``max_length`` when none is given: the DFlash training config for Qwen3.6-27B
#: (the seed's target model) uses 4,096.
DEFAULT_TRAIN_MAX_LENGTH = 4096


@dataclass(frozen=True, slots=True)
class TrainerView:
    """The trainer's reading of a row. ``tokenizer`` None: the served model's path, when readable."""

    tokenizer: str | None = None
    max_length: int = DEFAULT_TRAIN_MAX_LENGTH
    last_turn_only: bool = False

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise ConfigError(f"--train-max-length must be >= 1, got {self.max_length}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TrainerView:
        if not doc:
            return cls()
        tokenizer = doc.get("tokenizer")
        return cls(
            tokenizer=None if tokenizer is None else str(tokenizer),
            max_length=int(doc.get("max_length", DEFAULT_TRAIN_MAX_LENGTH)),
            last_turn_only=bool(doc.get("last_turn_only", False)),
        )


def add_trainer_flags(parser: argparse.ArgumentParser) -> None:
    """``--tokenizer``, ``--train-max-length``, ``--train-last-turn-only`` (default: the job's)."""
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


def view_from_args(args: argparse.Namespace, recorded: TrainerView | None = None) -> TrainerView:
    """The view the flags ask for, on top of ``recorded`` (the job's) or the defaults."""
    view = recorded or TrainerView()
    changes: dict[str, Any] = {}
    if getattr(args, "tokenizer", None) is not None:
        changes["tokenizer"] = args.tokenizer
    if getattr(args, "train_max_length", None) is not None:
        changes["max_length"] = args.train_max_length
    if getattr(args, "train_last_turn_only", None):
        changes["last_turn_only"] = True
    return replace(view, **changes) if changes else view
