"""A repair round of one chunk: what its message carries, and which records it regenerates.

A chunk is generated once into its chunk file. A sample that failed by a passing cause (a burst of
5xx, a timeout, an abort: :attr:`~dflash_tasks.core.record.Record.transient`) is regenerated later by
a repair round of its chunk, which writes the new records to a write-once file of its own
(``outputs/chunk-N.repair-R.jsonl``); the chunk file never changes. With a job amended by
``--repair-truncated --max-tokens N``, a round also regenerates the samples truncated at a smaller
budget, with budget ``N``. A thought cut short of the trainer's horizon (or of ``N``) is not
regenerated but continued from where it stopped (:mod:`dflash_tasks.core.continuation`). A sample
stopped in a loop is regenerated from its looped turn when the job's ``--on-loop`` says so
(:mod:`dflash_tasks.core.on_loop`), with the round's number as its sampling seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from dflash_tasks.core.continuation import carries, is_cut_thought, record_budget
from dflash_tasks.core.on_loop import OnLoop, tokens_saved
from dflash_tasks.core.record import Record
from dflash_tasks.core.states import Outcome


@dataclass(frozen=True, slots=True, order=True)
class RepairUnit:
    """Round ``round`` (1-based) of ``chunk``: regenerate its failed samples.

    ``permanent``: also those that failed permanently (``--retry-failed``, e.g. after the context
    length was raised); otherwise only the transient failures. ``max_tokens``: also those truncated
    at a smaller budget, regenerated with this one (the job's ``repair_truncated`` amendment).
    """

    chunk: int
    round: int
    permanent: bool = False
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.chunk < 0 or self.round < 1:
            raise ValueError(
                f"a repair round needs chunk >= 0 and round >= 1, got {self.chunk}, {self.round}"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"a repair round's max_tokens must be >= 1, got {self.max_tokens}")


def budget_of(record: Record) -> int:
    """The ``max_tokens`` the record was generated with (``sampling.max_tokens``; 0 if unknown)."""
    value = (record.sampling or {}).get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def truncated_below(record: Record, max_tokens: int | None) -> bool:
    """Whether the record was cut off (``finish_reason: length``) at a budget below ``max_tokens``."""
    return (
        max_tokens is not None
        and record.outcome is Outcome.TRUNCATED
        and record.finish_reason == "length"
        and budget_of(record) < max_tokens
    )


def needs_repair(
    record: Record,
    permanent: bool = False,
    max_tokens: int | None = None,
    horizon: int | None = None,
    on_loop: OnLoop | None = None,
) -> bool:
    """Whether a repair round regenerates or continues this current record (``horizon``: the
    trainer's ``max_length``; None: continue nothing but what ``max_tokens`` asks for; ``on_loop``:
    the job's policy for looped samples, None: none is regenerated)."""
    if not record.ok:
        return permanent or record.transient
    if record.turns[-1].looped:
        return on_loop is not None and on_loop.regenerates(record)
    if is_cut_thought(record.turns[-1]):  # continued, never regenerated
        return to_continue(record, max_tokens, horizon) > 0
    return truncated_below(record, max_tokens)


def to_continue(record: Record, max_tokens: int | None, horizon: int | None) -> int:
    """The new tokens a round continues this record's cut thought with (0: not continued)."""
    if horizon is None and max_tokens is None:
        return 0
    return record_budget(record, horizon or 0, max_tokens)


def to_repair(
    records: Iterable[Record],
    permanent: bool = False,
    max_tokens: int | None = None,
    horizon: int | None = None,
    on_loop: OnLoop | None = None,
) -> list[Record]:
    """The records a repair round regenerates or continues, in order."""
    return [r for r in records if needs_repair(r, permanent, max_tokens, horizon, on_loop)]


def superseded(old: Record, new: Record) -> tuple[int, int]:
    """The completion tokens of ``old`` that its repaired record ``new`` no longer holds (the turns a
    round generated again: paid for twice), and of those the looped turns' (a looped attempt
    regenerated), in one pass over the turns. A kept turn, and a continued one (its first part is
    the old turn), carry theirs."""
    later = new.turns
    tokens = looping = 0
    for i, turn in enumerate(old.turns):
        if i < len(later) and carries(later[i], turn):
            continue
        tokens += turn.usage.completion_tokens
        looping += turn.usage.completion_tokens if turn.looped else 0
    return tokens, looping


@dataclass(slots=True)
class Superseded:
    """Adds up :func:`superseded` as the store's reader replaces records (its ``on_replaced``),
    in all and by input source."""

    tokens: int = 0
    records: int = 0  # records replaced
    looping: int = 0  # of the tokens: those of looped attempts
    loop_tokens_saved: int = 0  # the budget the stops of those looped attempts left unspent
    #: Of ``tokens`` and ``loop_tokens_saved``: those of each source's records (a job of several).
    source_tokens: Counter[str] = field(default_factory=Counter)
    source_saved: Counter[str] = field(default_factory=Counter)

    def __call__(self, old: Record, new: Record) -> None:
        tokens, looping = superseded(old, new)
        saved = tokens_saved(old) if looping else 0
        self.tokens += tokens
        self.looping += looping
        self.loop_tokens_saved += saved
        self.records += 1
        if old.source is not None:
            self.source_tokens[old.source] += tokens
            self.source_saved[old.source] += saved
