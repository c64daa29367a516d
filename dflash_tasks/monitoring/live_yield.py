"""The trainable yield while the job runs: the ``yield`` section of the progress document.

The workers add each stored chunk's and repair round's yield to the job's counters
(``yield_*``, :meth:`~dflash_tasks.core.yields.YieldTally.counters`), planned as the default
export plans it from the loss counts they stored; this reads the tally back in the shape
``report`` and the export manifest give it, with the chunks it covers and what a million
trainable tokens cost so far. Only chunks a worker counted enter the ratio: a job served
without a readable tokenizer has no section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflash_tasks.core.yields import COUNTED_CHUNKS, YieldTally, cost_per_million_trainable


def yield_section(stats: Mapping[str, float], spent_usd: float | None) -> dict[str, Any] | None:
    """The ``yield`` section from the job's counters and its spend so far; None before any counted chunk.

    The cost per million trainable tokens is the spend per generated token (every token the job
    generated, counted or not) over the yield of the counted chunks.
    """
    chunks = round(stats.get(COUNTED_CHUNKS, 0.0))
    if chunks <= 0:
        return None
    tally = YieldTally.from_counters(stats)
    generated = stats.get("completion_tokens", 0.0)
    per_million = spent_usd / generated * 1e6 if spent_usd is not None and generated > 0 else None
    usd = cost_per_million_trainable(tally.ratio, per_million)
    return {
        **tally.to_dict(),
        "counted_chunks": chunks,
        "usd_per_million_trainable": None if usd is None else round(usd, 4),
    }


def describe_yield(section: Mapping[str, Any], done_chunks: int) -> str:
    """One line for ``status`` (and the demo): the yield, the cost per million trainable tokens,
    the largest shares of the rest, and the chunks it covers when not all."""
    generated, trainable = int(section["generated_tokens"]), int(section["trainable_tokens"] or 0)
    ratio = section.get("yield")
    line = f"{ratio:.3f}: " if isinstance(ratio, float | int) else ""
    line += f"{trainable:,} trainable of {generated:,} generated tokens"
    usd = section.get("usd_per_million_trainable")
    if isinstance(usd, float | int):
        line += f" | ${usd:,.2f} per million trainable"
    rest = _rest(section.get("where_the_rest_went") or {})
    if rest and generated:
        line += " | rest: " + ", ".join(f"{name} {n / generated:.1%}" for name, n in rest[:3])
    counted = int(section.get("counted_chunks") or 0)
    if counted < done_chunks:
        line += f" | over {counted:,} of {done_chunks:,} stored chunks (the rest not counted)"
    return line


def _rest(where: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Where the other generated tokens went, largest first (dropped rows by reason)."""
    named = [(f"dropped {r}", int(n)) for r, n in (where.get("dropped_rows") or {}).items()]
    named += [
        (name, int(where[key]))
        for key, name in (
            ("failed_turns", "failed turns"),
            ("superseded", "superseded"),
            ("past_max_length", "past max_length"),
            ("untrained_in_written_rows", "untrained"),
        )
        if isinstance(where.get(key), int)
    ]
    return sorted(((name, n) for name, n in named if n > 0), key=lambda kv: -kv[1])
