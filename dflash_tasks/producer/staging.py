"""Staging: split the validated input into chunk files in the store, once per job.

Staging is deterministic (same input, same chunks), so an enqueue killed halfway simply
stages again; ``manifest.json`` is written last and marks staging complete.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from dflash_tasks.core.conversation import blank_answers, count_turns
from dflash_tasks.core.errors import InputError
from dflash_tasks.core.job import INVALID_KEY, MANIFEST_KEY, Manifest, input_key
from dflash_tasks.core.sample import Sample, encode_chunk
from dflash_tasks.producer.inputs import InvalidLine, summarize_invalid
from dflash_tasks.producer.mix import InputMix
from dflash_tasks.store import Store


@dataclass(slots=True)
class StagingReport:
    """What staging (or a dry run) found in the input."""

    manifest: Manifest
    invalid: list[InvalidLine] = field(default_factory=list)


#: Chunk files written concurrently while the input is read: the writes (fsync, or a PUT) wait on
#: the disk or the network, the reading and validation on the CPU.
WRITERS = 4


def chunked(
    items: Iterable[Sample | InvalidLine], size: int, on_invalid: Callable[[InvalidLine], None]
) -> Iterator[list[Sample]]:
    """Group the valid samples of ``items`` into lists of ``size``; hand invalid lines to ``on_invalid``."""
    batch: list[Sample] = []
    for item in items:
        if isinstance(item, InvalidLine):
            on_invalid(item)
            continue
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class NoValidSample(InputError):
    """The input holds no usable prompt: the job is refused."""


def stage_input(
    source: str | Path | InputMix, store: Store | None, job_id: str, chunk_size: int, turns: str = "all"
) -> StagingReport:
    """Read ``source`` (the job's sources, or one location read as it is), write chunk inputs,
    ``invalid.jsonl`` and the manifest to ``store``.

    ``turns`` is the job's turns mode: with ``all`` the source's old answers are staged blank
    (they only mark where turns end), and the manifest counts each chunk's turns.
    With ``store=None`` nothing is written (a dry run): only the counts are computed. An input
    without a single valid sample raises :class:`NoValidSample` before the manifest is written.
    """
    invalid: list[InvalidLine] = []
    samples = chunks = 0
    chunk_turns: list[int] = []
    mix = source if isinstance(source, InputMix) else InputMix.of(source)
    items = mix.read()
    spans: dict[str, list[int]] = {}  # source -> [first chunk, last chunk]
    with _Writer(store, WRITERS) as writer:
        for index, batch in enumerate(chunked(items, chunk_size, invalid.append)):
            if turns == "all":
                batch = [Sample(s.id, blank_answers(s.messages), s.line, s.source) for s in batch]
            if store is not None:
                writer.write(input_key(index), encode_chunk(batch))
            samples += len(batch)
            chunks = index + 1
            chunk_turns.append(sum(count_turns(s.messages, turns) for s in batch))
            for name in {s.source for s in batch if s.source is not None}:
                spans.setdefault(name, [index, index])[1] = index
    if not samples:
        why = summarize_invalid(invalid) if invalid else "it holds no rows"
        raise NoValidSample("no valid sample in the input: " + why)
    # Every chunk file is stored (each write is atomic and durable) before the manifest says so.
    lines = samples + len(invalid)
    manifest = Manifest(
        job_id=job_id,
        lines=lines,
        samples=samples,
        invalid=len(invalid),
        chunk_size=chunk_size,
        chunks=chunks,
        # Only a job with multi-turn conversations counts its turns apart from its samples.
        turns=sum(chunk_turns) if sum(chunk_turns) != samples else None,
        chunk_turns=chunk_turns if sum(chunk_turns) != samples else None,
        sources=_source_figures(mix, spans),
    )
    if store is not None:
        store.write(INVALID_KEY, b"".join(_invalid_line(bad) for bad in invalid))
        store.write(MANIFEST_KEY, manifest.to_json())
    return StagingReport(manifest=manifest, invalid=invalid)


class _Writer:
    """Store writes on a few threads, at most ``2 * threads`` pending; the first failure is raised.

    Leaving the ``with`` block waits for every write, so the caller knows they all succeeded.
    """

    def __init__(self, store: Store | None, threads: int) -> None:
        self._store = store
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[None]] = deque()

    def __enter__(self) -> _Writer:
        return self

    def write(self, key: str, data: bytes) -> None:
        assert self._store is not None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="dflash-stage")
        while len(self._pending) >= 2 * self._threads:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._store.write, key, data))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                while self._pending:
                    self._pending.popleft().result()
        finally:
            for pending in self._pending:
                pending.cancel()
            if self._pool is not None:
                self._pool.shutdown(wait=True)


def _source_figures(mix: InputMix, spans: dict[str, list[int]]) -> list[dict[str, Any]] | None:
    if not mix.tagged:
        return None
    for figures in mix.figures:
        figures.first_chunk, figures.last_chunk = spans.get(figures.name, [None, None])
    return [f.to_dict() for f in mix.figures]


def _invalid_line(bad: InvalidLine) -> bytes:
    doc: dict[str, Any] = {"file": bad.file, "line": bad.line, "reason": bad.reason}
    if bad.source is not None:
        doc["source"] = bad.source
    return (json.dumps(doc, ensure_ascii=False) + "\n").encode()


def read_invalid(store: Store) -> list[dict[str, object]]:
    """The invalid-line report of a staged job."""
    try:
        data = store.read(INVALID_KEY)
    except KeyError:
        return []
    return [json.loads(line) for line in data.splitlines() if line.strip()]
