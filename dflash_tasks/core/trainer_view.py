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
from dflash_tasks.core.trainer_templates import REGISTERED, registered

#: The trainer's ``max_length`` when none is given: the DFlash training config for Qwen3.6-27B
#: (the seed's target model) uses 4,096.
DEFAULT_TRAIN_MAX_LENGTH = 4096


@dataclass(frozen=True, slots=True)
class TrainerView:
    """The trainer's reading of a row. ``tokenizer`` None: the served model's path, when readable."""

    tokenizer: str | None = None
    max_length: int = DEFAULT_TRAIN_MAX_LENGTH
    last_turn_only: bool = False
    #: SpecForge's registered chat template the trainer marks loss spans with; None: the markers
    #: of the tokenizer's own template (:mod:`dflash_tasks.core.trainer_templates`).
    template: str | None = None

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise ConfigError(f"--train-max-length must be >= 1, got {self.max_length}")
        if self.template is not None:
            registered(self.template)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.template is None:  # job.json as before the field existed
            del doc["template"]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TrainerView:
        if not doc:
            return cls()
        tokenizer = doc.get("tokenizer")
        return cls(
            tokenizer=None if tokenizer is None else str(tokenizer),
            max_length=int(doc.get("max_length", DEFAULT_TRAIN_MAX_LENGTH)),
            last_turn_only=bool(doc.get("last_turn_only", False)),
            template=None if doc.get("template") is None else str(doc["template"]),
        )


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
    if getattr(args, "train_template", None) is not None:
        changes["template"] = args.train_template
    return replace(view, **changes) if changes else view
