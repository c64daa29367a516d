"""Loss tokens counted by the worker beside its server, stored with the record (``loss_counts``).

The worker renders each sample's candidate rows (both layouts) under the job's trainer view with
the served model's tokenizer, read from the server's own disk, and stores what the trainer sees of
each row; ``export`` and ``report`` then add up instead of re-tokenizing. Stored as::

    "loss_counts": {"view": VIEW, "conversation": [ROW], "per_turn": [ROW, ...]}
    ROW = [tokens, loss_tokens, loss_tokens_untruncated, reasoning_turns, reasoning_dropped,
           generated_end]

``conversation`` is the record's one row in the conversation layout, ``per_turn`` one row per ok
turn in order (SpecForge's expanded layout). ``VIEW`` names what the count depends on
(:func:`view_key`); a command whose view differs counts again. Written only when present: a record
without it encodes byte for byte as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.trainer_view import TrainerView

_ROW_FIELDS = 6


def view_key(view: TrainerView, tokenizer: str, thinking: bool, preserve: bool) -> str:
    """What a stored count depends on: the tokenizer's path, the trainer's template, max_length and
    turns, thinking and whether earlier reasoning is kept."""
    return (
        f"tokenizer={tokenizer};template={view.template or 'tokenizer'};max_length={view.max_length};"
        f"last_turn_only={int(view.last_turn_only)};thinking={int(thinking)};preserve={int(preserve)}"
    )


@dataclass(frozen=True, slots=True)
class LossCounts:
    """A record's rows as the trainer sees them, per layout (tuples of :data:`ROW` integers)."""

    view: str
    conversation: tuple[tuple[int, ...], ...]
    per_turn: tuple[tuple[int, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "conversation": [list(r) for r in self.conversation],
            "per_turn": [list(r) for r in self.per_turn],
        }

    @classmethod
    def from_dict(cls, doc: Any) -> LossCounts:
        """Read a stored value; ValueError names what is wrong (the record's reader adds where)."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("view"), str):
            raise ValueError("an object with a string 'view'")
        return cls(
            doc["view"],
            _rows(doc.get("conversation"), "conversation"),
            _rows(doc.get("per_turn"), "per_turn"),
        )


def _rows(value: Any, name: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"'{name}' a list of rows")
    rows: list[tuple[int, ...]] = []
    for row in value:
        ok = isinstance(row, Sequence) and len(row) == _ROW_FIELDS
        if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in row):
            raise ValueError(f"'{name}' rows of {_ROW_FIELDS} non-negative integers")
        rows.append(tuple(row))
    return tuple(rows)
