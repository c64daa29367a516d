"""Paging through a job's samples one chunk file at a time, with filters; never the whole output.

A page is read from a :class:`Cursor` (chunk, position in the chunk) on: chunk files are read in
order, each one whole (a chunk is small) and dropped before the next, until the page is full,
:data:`MAX_CHUNKS_PER_PAGE` files were read or :data:`PAGE_SECONDS` went by (a rare filter then
gives a short page and a cursor to go on from). A sample looked up by id is looked for as its
JSON-encoded id in the chunk files' bytes; only a chunk holding it is decoded.
A sample's current record (repair rounds applied) comes from
:func:`~dflash_tasks.store.records.read_current`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dflash_tasks.core.errors import BadRecord
from dflash_tasks.core.job import output_key
from dflash_tasks.core.record import Record
from dflash_tasks.store.base import Store
from dflash_tasks.store.records import OutputListing, list_outputs, read_current

#: Chunk files one page reads at most (bounds a page's time and memory whatever the filter).
MAX_CHUNKS_PER_PAGE = 50
#: Reading stops at the first chunk boundary after this long (s): a page answers in about a second.
PAGE_SECONDS = 0.5
#: Samples on one page.
PAGE_SIZE = 50
OUTCOMES = ("complete", "truncated", "failed")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page starts: a chunk and a position in its file."""

    chunk: int = 0
    index: int = 0

    def __str__(self) -> str:
        return f"{self.chunk}.{self.index}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``"12.40"`` (chunk 12, sample 40); ValueError naming the text when it is not one."""
        chunk, _, index = text.partition(".")
        try:
            cursor = cls(int(chunk), int(index or "0"))
        except ValueError:
            raise ValueError(f"bad cursor {text!r}: expected CHUNK.INDEX") from None
        if cursor.chunk < 0 or cursor.index < 0:
            raise ValueError(f"bad cursor {text!r}: negative")
        return cursor


@dataclass(frozen=True, slots=True)
class SampleFilter:
    """Which samples a list shows; an empty field matches every sample."""

    outcome: str = ""  # complete | truncated | failed
    check: str = ""  # a quality check the sample fails
    min_tokens: int | None = None  # completion tokens, summed over the turns
    max_tokens: int | None = None
    id_contains: str = ""
    source: str = ""  # the input source, in a job of several sources

    def __post_init__(self) -> None:
        if self.outcome and self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    def matches(self, record: Record) -> bool:
        tokens = record.usage.completion_tokens
        return (
            (not self.outcome or record.outcome.value == self.outcome)
            and (not self.check or self.check in (record.checks or ()))
            and (self.min_tokens is None or tokens >= self.min_tokens)
            and (self.max_tokens is None or tokens <= self.max_tokens)
            and (not self.id_contains or self.id_contains in record.id)
            and (not self.source or record.source == self.source)
        )


@dataclass(frozen=True, slots=True)
class Found:
    """A sample and where it is."""

    chunk: int
    index: int
    record: Record


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: the samples, where the next page starts (None: the end), the chunk
    files read, and how many of the stored chunks there are."""

    rows: tuple[Found, ...]
    next: Cursor | None
    chunks_read: int
    chunks_stored: int


def chunk_records(store: Store, listing: OutputListing, chunk: int) -> list[Record]:
    """The current records of one stored chunk; damaged lines are skipped, a vanished file is empty."""
    skipped: list[BadRecord] = []
    try:
        return read_current(store, chunk, listing.rounds_of(chunk), on_bad=skipped.append)
    except KeyError:
        return []


def read_page(
    store: Store,
    wanted: SampleFilter,
    start: Cursor = Cursor(),
    size: int = PAGE_SIZE,
    listing: OutputListing | None = None,
) -> Page:
    """The samples matching ``wanted`` from ``start`` on, at most ``size`` of them."""
    listing = listing or list_outputs(store)
    chunks = sorted(c for c in listing.chunks if c >= start.chunk)
    rows: list[Found] = []
    read = 0
    started = time.monotonic()
    for chunk in chunks:
        if read >= MAX_CHUNKS_PER_PAGE or (read and time.monotonic() - started > PAGE_SECONDS):
            return Page(tuple(rows), Cursor(chunk, 0), read, len(listing.chunks))
        records = chunk_records(store, listing, chunk)
        read += 1
        first = start.index if chunk == start.chunk else 0
        for index in range(first, len(records)):
            if len(rows) >= size:
                return Page(tuple(rows), Cursor(chunk, index), read, len(listing.chunks))
            if wanted.matches(records[index]):
                rows.append(Found(chunk, index, records[index]))
    return Page(tuple(rows), None, read, len(listing.chunks))


def find_sample(
    store: Store, sample_id: str, chunk_hint: int | None = None, listing: OutputListing | None = None
) -> Found | None:
    """The sample with id ``sample_id``: in chunk ``chunk_hint`` when given, else chunk by chunk."""
    listing = listing or list_outputs(store)
    needles = {json.dumps(sample_id, ensure_ascii=a).encode() for a in (False, True)}
    for chunk in _search_order(listing, chunk_hint):
        if not _holds(store, chunk, needles):
            continue
        for index, record in enumerate(chunk_records(store, listing, chunk)):
            if record.id == sample_id:
                return Found(chunk, index, record)
    return None


def _holds(store: Store, chunk: int, needles: set[bytes]) -> bool:
    """Whether chunk ``chunk``'s file holds one of ``needles`` (an id as JSON encodes it), anywhere.

    Every record a repair round writes is one of the chunk file's ids, so the chunk file decides;
    a false match only costs decoding that chunk.
    """
    try:
        data = store.read(output_key(chunk))
    except KeyError:
        return False
    return any(needle in data for needle in needles)


def _search_order(listing: OutputListing, hint: int | None) -> Iterator[int]:
    if hint is not None and hint in listing.chunks:
        yield hint
    yield from (c for c in sorted(listing.chunks) if c != hint)


def random_sample(store: Store, rng: random.Random, listing: OutputListing | None = None) -> Found | None:
    """A sample drawn at random: a stored chunk at random, then one of its samples."""
    listing = listing or list_outputs(store)
    chunks = sorted(listing.chunks)
    for _ in range(8):  # an empty or vanished chunk file: draw again
        if not chunks:
            return None
        chunk = rng.choice(chunks)
        records = chunk_records(store, listing, chunk)
        if records:
            index = rng.randrange(len(records))
            return Found(chunk, index, records[index])
    return None
