"""The trainable yield: the loss tokens the trainer gets per token the servers generated.

Generated tokens are the completion tokens of every turn of every current record (ok, truncated and
failed turns alike); trainable tokens are the loss tokens of the rows the export writes, under the
trainer's template and ``max_length``. The rest is accounted for: the generated tokens of rows left
out (by reason), of failed turns, the loss tokens ``max_length`` cuts, and what is left (turns the
template leaves untrained, less the template's own tokens counted as loss).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class YieldTally:
    """Adds up generated and trainable tokens as rows are planned (export, report)."""

    generated: int = 0  # completion tokens of every turn
    trainable: int = 0  # loss tokens of the rows written (within max_length)
    written_generated: int = 0  # completion tokens of the turns the written rows carry as their own
    lost_to_max_length: int = 0  # loss tokens of written rows past max_length
    failed_turns: int = 0  # completion tokens of failed turns
    dropped: Counter[str] = field(default_factory=Counter)  # completion tokens of rows left out, by reason
    horizon_rows: int = 0  # rows cut at max_tokens written by the horizon rule
    counted: bool = True  # False when no tokenizer counted loss tokens

    @property
    def ratio(self) -> float | None:
        """Trainable / generated; None before anything was generated or without a count."""
        if not self.counted or not self.generated:
            return None
        return self.trainable / self.generated

    @property
    def untrained(self) -> int:
        """Generated tokens of written rows the trainer does not learn from, net of template tokens."""
        return self.written_generated - self.trainable - self.lost_to_max_length

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "generated_tokens": self.generated,
            "trainable_tokens": self.trainable if self.counted else None,
            "yield": None if ratio is None else round(ratio, 4),
            "generated_per_trainable": None if not ratio else round(1 / ratio, 4),
            "where_the_rest_went": {
                "dropped_rows": dict(self.dropped),
                "failed_turns": self.failed_turns,
                "past_max_length": self.lost_to_max_length,
                "untrained_in_written_rows": self.untrained if self.counted else None,
            },
            "rows_written_by_horizon_rule": self.horizon_rows,
        }

    def render(self) -> str:
        """Two or three lines: the yield, then where the rest of the generated tokens went."""
        ratio = self.ratio
        if ratio is None:
            return f"  yield             {self.generated:,} tokens generated; trainable tokens not counted"
        rest = [f"{reason} {n:,}" for reason, n in self.dropped.most_common()]
        rest += [f"failed turns {self.failed_turns:,}"] if self.failed_turns else []
        rest += [
            f"past max_length {self.lost_to_max_length:,}",
            f"untrained in written rows {self.untrained:,}",
        ]
        return "\n".join(
            [
                f"  yield             {ratio:.3f}: {self.trainable:,} trainable of {self.generated:,} "
                f"generated tokens ({1 / ratio if ratio else float('inf'):.2f} generated per trainable)",
                "  the rest          " + ", ".join(rest),
            ]
        )


def cost_per_million_trainable(ratio: float | None, usd_per_million_generated: float) -> float | None:
    """What a million trainable tokens cost at a price per million generated tokens."""
    return None if not ratio else usd_per_million_generated / ratio
