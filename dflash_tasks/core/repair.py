"""A repair round of one chunk: what its message carries, and which records it regenerates.

A chunk is generated once into its chunk file. A sample that failed by a passing cause (a burst of
5xx, a timeout, an abort: :attr:`~dflash_tasks.core.record.Record.transient`) is regenerated later by
a repair round of its chunk, which writes the new records to a write-once file of its own
(``outputs/chunk-N.repair-R.jsonl``); the chunk file never changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dflash_tasks.core.record import Record


@dataclass(frozen=True, slots=True, order=True)
class RepairUnit:
    """Round ``round`` (1-based) of ``chunk``: regenerate its failed samples.

    ``permanent``: also those that failed permanently (``--retry-failed``, e.g. after the context
    length was raised); otherwise only the transient failures.
    """

    chunk: int
    round: int
    permanent: bool = False

    def __post_init__(self) -> None:
        if self.chunk < 0 or self.round < 1:
            raise ValueError(
                f"a repair round needs chunk >= 0 and round >= 1, got {self.chunk}, {self.round}"
            )


def needs_repair(record: Record, permanent: bool = False) -> bool:
    """Whether a repair round regenerates this current record."""
    return not record.ok and (permanent or record.transient)


def to_repair(records: Iterable[Record], permanent: bool = False) -> list[Record]:
    """The records a repair round regenerates, in order."""
    return [r for r in records if needs_repair(r, permanent)]
