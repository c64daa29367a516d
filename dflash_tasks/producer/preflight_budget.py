"""The preflight's projection of the budget: the yield and cost of the chosen ``--max-tokens``
against the alternatives (the trainer's horizon, 4,096, 8,192, 32,768), from the preflight's own
sample.

The chosen budget's figures are the sample's, planned as the default export plans them. Another
budget ``B`` is projected turn by turn from the same records, with the rules the export applies:

* a turn that generated ``c <= B`` tokens generates the same under ``B``, its rows unchanged;
* a turn that generated more is cut at ``B``: it generates ``B``, the conversation stops there
  (later turns are not sent), and its row is written by the horizon rule when ``B`` reaches the
  trainer's window, ``max_length`` less the turn's prompt tokens (the row then trains exactly what
  it trained before: the window was full), and left out as truncated otherwise (the first pass:
  repair rounds would continue it);
* ``horizon`` gives each turn its window.

Cuts below what the sample generated are so exact (up to the server's prompt tokens standing for
the trainer's prefix); where ``B`` is above a budget at which the sample's turn was cut, the turn
would have run longer, by an amount the sample does not show: those figures are lower bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.budget import HORIZON, HORIZON_FLOOR
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Record, Turn
from dflash_tasks.core.yields import YieldTally, cost_per_million_trainable

#: The budgets the preflight compares the chosen one with.
ALTERNATIVES: tuple[int | str, ...] = (HORIZON, 4096, 8192, 32768)

#: Loss tokens of the rows the export writes, by (sample id, turn index; None: the whole conversation).
WrittenLoss = Mapping[tuple[str, int | None], int]


@dataclass(frozen=True, slots=True)
class BudgetProjection:
    """One budget's projection on the preflight's sample."""

    budget: int | str  # tokens, or "horizon"
    chosen: bool
    generated: int
    trainable: int
    lower_bound: bool  # a cut turn of the sample would have run longer: figures at least these

    @property
    def ratio(self) -> float | None:
        return self.trainable / self.generated if self.generated else None

    def to_dict(self, usd_per_million_generated: float | None) -> dict[str, Any]:
        ratio = self.ratio
        cost = cost_per_million_trainable(ratio, usd_per_million_generated)
        return {
            "max_tokens": self.budget,
            "chosen": self.chosen,
            "generated_tokens": self.generated,
            "trainable_tokens": self.trainable,
            "yield": None if ratio is None else round(ratio, 4),
            "usd_per_million_trainable": None if cost is None else round(cost, 4),
            "lower_bound": self.lower_bound,
        }


def project_budgets(
    records: Iterable[Record],
    written: WrittenLoss,
    max_length: int,
    spec: GenerationSpec,
    tally: YieldTally,
    alternatives: Iterable[int | str] = ALTERNATIVES,
) -> list[BudgetProjection]:
    """The chosen budget (the sample's own figures, ``tally``) and each of ``alternatives``."""
    chosen: int | str = HORIZON if spec.at_horizon else spec.max_tokens
    sample = list(records)
    out = [BudgetProjection(chosen, True, tally.generated, tally.trainable, False)]
    for budget in dict.fromkeys(alternatives):
        if budget != chosen:
            out.append(_project(sample, written, max_length, budget))
    return sorted(out, key=lambda p: (p.budget != HORIZON, p.budget if isinstance(p.budget, int) else 0))


def _project(
    records: list[Record], written: WrittenLoss, max_length: int, budget: int | str
) -> BudgetProjection:
    generated = trainable = 0
    lower = False
    for record in records:
        g, t, more = _record(record, written, max_length, budget)
        generated, trainable, lower = generated + g, trainable + t, lower or more
    return BudgetProjection(budget, False, generated, trainable, lower)


def _record(
    record: Record, written: WrittenLoss, max_length: int, budget: int | str
) -> tuple[int, int, bool]:
    """(generated, trainable, lower bound) of one record under ``budget``."""
    generated = trainable = 0
    lower = False
    whole = written.get((record.id, None), 0)  # the conversation layout's one row
    for index, turn in enumerate(record.turns):
        window = max_length - turn.usage.prompt_tokens
        limit = max(HORIZON_FLOOR, window) if budget == HORIZON else int(budget)
        done = turn.usage.completion_tokens
        if done > limit:  # cut here: its row kept only when the cut reaches the trainer's window
            kept = limit >= window
            trainable += (written.get((record.id, index), 0) if kept else 0) + (whole if kept else 0)
            return generated + limit, trainable, lower
        generated += done
        trainable += written.get((record.id, index), 0)
        lower = lower or (_cut(turn) and limit > done)
    return generated, trainable + whole, lower


def _cut(turn: Turn) -> bool:
    """Whether the turn hit its budget (not :attr:`Turn.cut_short`: a loop stops at the same place
    under any budget)."""
    return turn.finish_reason == "length"


def render_budgets(projections: list[BudgetProjection], usd_per_million_generated: float | None) -> list[str]:
    """The preflight's lines: one per budget, the chosen one marked, lower bounds with ``>=``."""
    if len(projections) < 2:
        return []
    lines = ["  budget            projected on this sample (>=: its cut turns would have run longer)"]
    for p in projections:
        doc = p.to_dict(usd_per_million_generated)
        at = ">=" if p.lower_bound else "  "
        name = f"{p.budget:,}" if isinstance(p.budget, int) else str(p.budget)
        ratio = "-" if doc["yield"] is None else f"{doc['yield']:.3f}"
        cost = doc["usd_per_million_trainable"]
        line = (
            f"    {name + (' (chosen)' if p.chosen else ''):<18} yield {ratio}  "
            f"generated {at}{p.generated:,}  trainable {at}{p.trainable:,}"
        )
        if cost is not None:
            line += f"  ~${cost:,.2f} per million trainable"
        lines.append(line)
    return lines
