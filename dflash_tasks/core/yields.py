"""The trainable yield: the loss tokens the trainer gets per token the servers generated.

Generated tokens are the completion tokens of every turn of every current record (ok, truncated and
failed turns alike) and of every turn a repair round generated again (``superseded``: paid for,
then replaced); trainable tokens are the loss tokens of the rows the export writes, under the
trainer's template and ``max_length``, each row counting at most the tokens its own turns generated
(:func:`written_share`: the template's own loss tokens were never generated). The rest is accounted
for: the generated tokens of rows left out (by reason), of failed turns, of superseded turns, of
loops (``looping``: the looped attempts a repair round regenerated, the rows left out for their
loop, and the loop itself where a row keeps the text before it), the generated tokens ``max_length``
cuts, and what is left (turns the template leaves untrained), so that the parts add up to the
generated tokens and none is negative.

The workers add the same tally up live, chunk by chunk and round by round, in the job's counters
(:meth:`YieldTally.counters`, read back by :meth:`YieldTally.from_counters`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The prefix of the job counters that carry a live tally (``yield_dropped_<reason>`` by reason).
COUNTER_PREFIX = "yield_"
_DROPPED = COUNTER_PREFIX + "dropped_"
#: The counter of chunks whose records entered the live tally (the workers counted their loss tokens).
COUNTED_CHUNKS = "yield_counted_chunks"
#: The tally's integer fields, as job counters.
_COUNTERS = {
    "generated": "yield_generated_tokens",
    "trainable": "yield_trainable_tokens",
    "written_generated": "yield_written_generated",
    "lost_to_max_length": "yield_past_max_length",
    "failed_turns": "yield_failed_turns",
    "superseded": "yield_superseded",
    "looping": "yield_looping",
    "horizon_rows": "yield_horizon_rows",
}


@dataclass(slots=True)
class YieldTally:
    """Adds up generated and trainable tokens as rows are planned (export, report)."""

    generated: int = 0  # completion tokens of every turn, superseded ones included
    trainable: int = 0  # loss tokens of the rows written (within max_length), generated ones (written_share)
    written_generated: int = 0  # completion tokens of the turns the written rows carry as their own
    lost_to_max_length: int = 0  # loss tokens of written rows past max_length, generated ones
    failed_turns: int = 0  # completion tokens of failed turns
    superseded: int = 0  # completion tokens of turns a repair round generated again (loops apart)
    looping: int = 0  # completion tokens of looped turns never trained (see the module docstring)
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
        """Generated tokens of written rows the trainer does not learn from (earlier turns the
        template leaves untrained)."""
        return self.written_generated - self.trainable - self.lost_to_max_length

    def add_written(self, generated: int, loss_tokens: int | None = None, lost: int = 0) -> int:
        """A row written: ``generated`` tokens by its own turns, ``loss_tokens`` within ``max_length``
        and ``lost`` past it as the trainer's view counts them (None: not counted). Returns the
        trainable tokens it adds (:func:`written_share`)."""
        self.written_generated += generated
        if loss_tokens is None:
            return 0
        trainable, past = written_share(generated, loss_tokens, lost)
        self.trainable += trainable
        self.lost_to_max_length += past
        return trainable

    def add_superseded(self, tokens: int, looping: int = 0) -> None:
        """Turns a repair round generated again: paid for, no longer in any record (``looping`` of
        the ``tokens``: those of looped attempts, counted under ``looping``)."""
        self.generated += tokens
        self.superseded += tokens - looping
        self.looping += looping

    def counters(self, minus: YieldTally | None = None) -> dict[str, float]:
        """The tally as job counters (``yield_*``), less ``minus`` (what a repair round replaced)."""
        out = {
            name: float(getattr(self, field_name) - (getattr(minus, field_name) if minus else 0))
            for field_name, name in _COUNTERS.items()
        }
        before = minus.dropped if minus else Counter[str]()
        for reason in sorted(set(self.dropped) | set(before)):
            if self.dropped[reason] != before[reason]:
                out[_DROPPED + reason] = float(self.dropped[reason] - before[reason])
        return out

    @classmethod
    def from_counters(cls, counters: Mapping[str, float]) -> YieldTally:
        """The tally the workers added up in a job's counters (:meth:`counters`)."""
        tally = cls()
        for field_name, name in _COUNTERS.items():
            setattr(tally, field_name, round(counters.get(name, 0.0)))
        for name, n in counters.items():
            if name.startswith(_DROPPED) and round(n):
                tally.dropped[name[len(_DROPPED) :]] = round(n)
        return tally

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "generated_tokens": self.generated,
            "trainable_tokens": self.trainable if self.counted else None,
            "yield": None if ratio is None else round(ratio, 4),
            "generated_per_trainable": None if not ratio else round(1 / ratio, 4),
            "where_the_rest_went": {
                "dropped_rows": {reason: n for reason, n in self.dropped.items() if n},
                "failed_turns": self.failed_turns,
                "superseded": self.superseded,
                "looping": self.looping,
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
        rest += [f"superseded by repairs {self.superseded:,}"] if self.superseded else []
        rest += [f"looping {self.looping:,}"] if self.looping else []
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


def written_share(generated: int, loss_tokens: int, lost: int) -> tuple[int, int]:
    """A written row's ``(trainable, past max_length)`` tokens in the yield: of the ``generated``
    tokens its own turns generated, those among its ``loss_tokens`` (within ``max_length``), then
    those among the ``lost`` ones (past it). The loss tokens the template writes itself were never
    generated: the newline of every end of turn (``<|im_end|>\\n``; the server generated only
    ``<|im_end|>``), and after a turn cut at ``max_tokens`` the whole end of turn and, in its thought,
    the ``\\n</think>\\n\\n`` closing it; a real tokenizer may also merge across the places the
    texts were joined. Counted, they made a row's trainable tokens exceed its generated ones, the
    yield exceed 1 and the untrained tokens negative."""
    trainable = min(loss_tokens, generated)
    return trainable, min(lost, generated - trainable)


def cost_per_million_trainable(ratio: float | None, usd_per_million_generated: float | None) -> float | None:
    """What a million trainable tokens cost at a price per million generated tokens (None without
    a yield or a price)."""
    return None if not ratio or usd_per_million_generated is None else usd_per_million_generated / ratio
