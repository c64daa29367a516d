"""Reading a job's output records: the current record of each sample, chunk by chunk, in input order.

A chunk file is written once and never changes. A repair round that regenerates some of its
samples writes their new records to a write-once file of its own
(:func:`~dflash_tasks.core.job.repair_key`); a sample's current record is the one of the latest
round that holds it, else the chunk file's. This module is the one place that rule lives: every
reader (``verify``, ``export``, ``report``, the preflight, the repair planner and the workers'
repair rounds) goes through :func:`read_current` or :func:`iter_records`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from dflash_tasks.core.errors import BadRecord, RepeatedRecord
from dflash_tasks.core.job import (
    OUTPUTS_PREFIX,
    Manifest,
    output_key,
    parse_chunk_key,
    parse_repair_key,
    repair_key,
)
from dflash_tasks.core.record import Record, decode_records
from dflash_tasks.store.base import Store

#: Called with each damaged line instead of raising (``verify`` reports them all).
OnBad = Callable[[BadRecord], None]
#: Called with ``(old, new)`` each time a later round's record replaces an earlier one (the yield
#: counts what a round generated again: :meth:`~dflash_tasks.core.row_planner.RowPlanner.supersede`).
OnReplaced = Callable[[Record, Record], None]


@dataclass(frozen=True, slots=True)
class OutputListing:
    """What ``outputs/`` holds, from one listing: the stored chunks and the repair rounds of each."""

    chunks: frozenset[int]
    rounds: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # chunk -> rounds, ascending

    def rounds_of(self, chunk: int) -> tuple[int, ...]:
        return self.rounds.get(chunk, ())

    def last_round(self, chunk: int) -> int:
        """The chunk's latest repair round (0: none)."""
        rounds = self.rounds.get(chunk, ())
        return rounds[-1] if rounds else 0


def list_outputs(store: Store) -> OutputListing:
    """One listing of ``outputs/``: chunk files and repair files (other keys are ignored)."""
    chunks: set[int] = set()
    rounds: dict[int, list[int]] = {}
    for key in store.list(OUTPUTS_PREFIX):
        chunk = parse_chunk_key(key)
        if chunk is not None:
            chunks.add(chunk)
            continue
        repair = parse_repair_key(key)
        if repair is not None:
            rounds.setdefault(repair[0], []).append(repair[1])
    return OutputListing(frozenset(chunks), {c: tuple(sorted(r)) for c, r in rounds.items()})


def read_current(
    store: Store,
    chunk: int,
    rounds: tuple[int, ...] = (),
    on_bad: OnBad | None = None,
    on_replaced: OnReplaced | None = None,
) -> list[Record]:
    """The current record of each sample of a stored ``chunk``, in its chunk file's order.

    ``rounds``: the chunk's repair rounds (:meth:`OutputListing.rounds_of`); a later round's record
    replaces the earlier one of the same id (and goes to ``on_replaced`` with it). A damaged line,
    a repair record whose id the chunk file does not hold, or one whose id its round's file already
    held (:class:`RepeatedRecord`), raises :class:`BadRecord` naming the file and line, or goes to
    ``on_bad`` (and is skipped). Raises :class:`KeyError` when the chunk file does not exist.
    """
    key = output_key(chunk)
    records = list(_decode(store.read(key), key, on_bad))
    where = {r.id: i for i, r in enumerate(records)}
    for round_ in rounds:
        rkey = repair_key(chunk, round_)
        first: dict[str, int] = {}  # id -> its line in this round's file
        for number, record in enumerate(_decode(store.read(rkey), rkey, on_bad), 1):
            index = where.get(record.id)
            if index is not None and record.id not in first:
                first[record.id] = number
                if on_replaced is not None:
                    on_replaced(records[index], record)
                records[index] = record
                continue
            bad = (
                BadRecord(f"{rkey}:{number}", f"id {record.id!r} is not in {key}", "id")
                if index is None
                else RepeatedRecord(
                    f"{rkey}:{number}",
                    f"id {record.id!r} written again by round {round_} of chunk {chunk}: "
                    f"first at line {first[record.id]}",
                    "id",
                )
            )
            if on_bad is None:
                raise bad
            on_bad(bad)
    return records


def _decode(data: bytes, key: str, on_bad: OnBad | None) -> Iterator[Record]:
    if on_bad is None:
        yield from decode_records(data, key)
        return
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            try:
                yield Record.from_json(raw, f"{key}:{number}")
            except BadRecord as exc:
                on_bad(exc)


def iter_records(
    store: Store,
    manifest: Manifest,
    missing: list[int] | None = None,
    on_replaced: OnReplaced | None = None,
) -> Iterator[Record]:
    """Every sample's current record in input order; chunks not done yet are skipped (and listed
    in ``missing``); each record a repair round replaced goes to ``on_replaced`` with its successor.

    A damaged line raises :class:`~dflash_tasks.core.errors.BadRecord` naming the file, the line
    and the field (``verify`` reports every one instead of stopping at the first).
    """
    listing = list_outputs(store)
    for chunk in range(manifest.chunks):
        if chunk not in listing.chunks:
            if missing is not None:
                missing.append(chunk)
            continue
        try:
            records = read_current(store, chunk, listing.rounds_of(chunk), on_replaced=on_replaced)
        except KeyError:  # deleted since the listing (a failed preflight's sample)
            if missing is not None:
                missing.append(chunk)
            continue
        yield from records
