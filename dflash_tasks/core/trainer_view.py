"""How the drafter trainer will read the exported rows: its tokenizer, ``max_length`` and turns.

Recorded in ``job.json`` (``trainer``) when the job is made; ``enqueue``, ``report``, ``export``
and the page take the same flags (:mod:`dflash_tasks.cli.trainer_flags`), which override the
recorded view for that one command (a re-run after a failed preflight can fix
``--train-max-length`` without changing the job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.trainer_templates import registered

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


@dataclass(frozen=True, slots=True)
class TrainerOverrides:
    """One command's changes to the job's recorded view (its ``--tokenizer``, ``--train-*`` flags):
    None (False) keeps the recorded value."""

    tokenizer: str | None = None
    max_length: int | None = None
    last_turn_only: bool = False
    template: str | None = None

    def on(self, recorded: TrainerView | None = None) -> TrainerView:
        """The view these overrides ask for, on top of ``recorded`` (the job's) or the defaults."""
        view = recorded or TrainerView()
        changes: dict[str, Any] = {}
        if self.tokenizer is not None:
            changes["tokenizer"] = self.tokenizer
        if self.max_length is not None:
            changes["max_length"] = self.max_length
        if self.last_turn_only:
            changes["last_turn_only"] = True
        if self.template is not None:
            changes["template"] = self.template
        return replace(view, **changes) if changes else view
