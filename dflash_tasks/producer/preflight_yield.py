"""The preflight's projected trainable yield: the default export's rows planned on its sample.

The sample's records go through the same :class:`RowPlanner` as ``export`` and ``report``, so the
figure is the one they would state on those records. A yield under :data:`YIELD_TARGET` is named
with what would raise it, read from where the rest of the generated tokens went.
"""

from __future__ import annotations

from collections.abc import Iterable

from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.record import Record
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.core.yields import YieldTally

YIELD_TARGET = 0.95  # below this share of generated tokens trained on, the preflight says why


def planned_yield(job: JobDefinition, view: TrainerView, records: Iterable[Record]) -> RowPlanner:
    """The default export's plan of ``records`` (``report`` plans the same): its ``yields``,
    ``layout`` and each written row's loss tokens (``written_loss``)."""
    planner = RowPlanner(job, view, ExportOptions())
    planner.written_loss = {}
    for _ in planner.rows(records):
        pass
    return planner


def what_would_raise(tally: YieldTally, layout: str) -> list[str]:
    """What raises a yield under the target, largest loss first; empty at or above it."""
    ratio = tally.ratio
    if ratio is None or ratio >= YIELD_TARGET or not tally.generated:
        return []
    losses: list[tuple[int, str]] = []
    cut = tally.dropped.get("truncated", 0)
    if cut:
        losses.append(
            (
                cut,
                "thoughts cut at max_tokens short of the trainer's horizon: `enqueue --wait` continues "
                "them in its repair rounds (continuation); --max-tokens horizon cuts none short of it",
            )
        )
    if tally.counted and tally.untrained > 0:
        fix = (
            "earlier assistant turns the trainer's template leaves untrained: export --layout per-turn"
            if layout != "per-turn"
            else "turns the trainer's template leaves untrained"
        )
        losses.append((tally.untrained, fix))
    if tally.lost_to_max_length:
        losses.append(
            (
                tally.lost_to_max_length,
                "tokens past the trainer's max_length: --max-tokens horizon stops paying for them",
            )
        )
    if tally.looping:
        losses.append(
            (
                tally.looping,
                "thoughts or answers stopped in a loop: at --temperature 0 raise it; --on-loop prefix "
                "keeps the text before a loop",
            )
        )
    other = {k: v for k, v in tally.dropped.items() if k != "truncated" and v}
    for reason, n in sorted(other.items(), key=lambda kv: -kv[1]):
        losses.append((n, f"rows left out as {reason}"))
    ranked = sorted(losses, reverse=True)
    return [f"{n / tally.generated:.1%} of generated tokens: {fix}" for n, fix in ranked]
