"""A chaos run's current records, and what each repair round may have written.

A chunk file is written once; a repair round of it writes ``chunk-N.repair-R.jsonl`` once, and a
sample's current record is the one of the latest round that holds it, else the chunk file's: the
rule of :func:`dflash_tasks.store.records.read_current`, restated here over plain JSON so that the
checker does not read the store through the code under test.

Reading by id hides what a round did wrong: a round that writes a sample twice, or a record under
another sample's id, still leaves one current record per id. :func:`check_rounds` therefore holds
every round's file to what a round may write:

* rounds of a chunk are numbered 1, 2, ... without a gap, and each record names its round;
* each record holds an id of its chunk file, at most once in the file;
* it replaces a record that needed a round: a transient failure, or a thought cut at
  ``max_tokens`` (a complete record, or a permanent failure, is never rewritten);
* a cut thought comes back continued, or (its continuation failed) exactly as it was: never failed,
  never shorter. A continued turn is its parts joined: the cut turn's parts first, each part's
  characters adding up to the turn's text, its tokens to the turn's, only the last part stopping.

It counts the thoughts cut, continued, and the continuations that failed (retried by a later round).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

Row = dict[str, Any]


class Readable(Protocol):
    """What the reader needs of the store (:class:`tests.chaos.services.Output`)."""

    def chunk_versions(self) -> dict[str, str]: ...

    def read(self, key: str) -> bytes | None: ...


@dataclass
class ChunkFiles:
    """One stored chunk: its file's rows and its repair rounds' (number, rows), ascending."""

    name: str
    rows: list[Row]
    rounds: list[tuple[int, list[Row]]] = field(default_factory=list)

    def round_name(self, number: int) -> str:
        return f"{self.name[: -len('.jsonl')]}.repair-{number}.jsonl"

    def current(self) -> list[Row]:
        """The current record of each sample, in the chunk file's order (a later round wins)."""
        rows = list(self.rows)
        where = {str(row.get("id")): i for i, row in enumerate(rows)}
        for _, round_rows in self.rounds:
            for row in round_rows:
                index = where.get(str(row.get("id")))
                if index is not None:  # an id the chunk lacks is check_rounds' to report
                    rows[index] = row
        return rows


def is_repair_file(name: str) -> bool:
    """Whether ``name`` is a repair round's file (``chunk-N.repair-R.jsonl``), not a chunk file."""
    return ".repair-" in name


def rows_of(data: bytes | None) -> list[Row]:
    return [json.loads(line) for line in (data or b"").splitlines() if line.strip()]


def load(output: Readable) -> list[ChunkFiles]:
    """Every stored chunk with its repair rounds (a round whose chunk file is missing is kept
    under that chunk's name with no rows, for :func:`check_rounds` to report)."""
    names = sorted(output.chunk_versions())
    chunks = {n: ChunkFiles(n, rows_of(output.read(f"outputs/{n}"))) for n in names if not is_repair_file(n)}
    for name in (n for n in names if is_repair_file(n)):
        stem, _, tail = name.rpartition(".repair-")
        chunk = chunks.setdefault(f"{stem}.jsonl", ChunkFiles(f"{stem}.jsonl", []))
        chunk.rounds.append((int(tail[: -len(".jsonl")]), rows_of(output.read(f"outputs/{name}"))))
    for chunk in chunks.values():
        chunk.rounds.sort(key=lambda r: r[0])
    return [chunks[n] for n in sorted(chunks)]


def current_records(chunks: list[ChunkFiles]) -> Iterator[Row]:
    for chunk in chunks:
        yield from chunk.current()


def continued_turns(chunks: list[ChunkFiles]) -> dict[str, tuple[str, str]]:
    """The (reasoning, content) of each current record whose last turn was continued, by id."""
    return {
        str(row.get("id")): (str(last_turn(row).get("reasoning", "")), str(last_turn(row).get("content", "")))
        for row in current_records(chunks)
        if _continued(row) and not is_cut(row)
    }


@dataclass
class RoundCounts:
    """What the repair rounds did, counted over the files (see the module docstring)."""

    rounds: int = 0  # repair files
    cut: int = 0  # samples whose thought a request cut at max_tokens (first pass or a round's regeneration)
    continued: int = 0  # of them, continued to an answer: the current record's turn has several parts
    continuations_failed: int = 0  # round records that left a cut thought as it was (a later round retried)
    left_cut: int = 0  # current records still holding a cut thought
    continuation_requests: int = 0  # the parts after the first of the current continued turns
    transient_repaired: int = 0  # transient failures a round regenerated into an ok record


def check_rounds(chunks: list[ChunkFiles]) -> tuple[RoundCounts, list[str]]:
    """The counts, and every way a repair round broke the rules of the module docstring."""
    counts = RoundCounts()
    problems: list[str] = []
    for chunk in chunks:
        _check_chunk(chunk, counts, problems)
    return counts, problems


def _check_chunk(chunk: ChunkFiles, counts: RoundCounts, problems: list[str]) -> None:
    if not chunk.rows and chunk.rounds:
        problems.append(f"{chunk.round_name(chunk.rounds[0][0])}: a repair round of a chunk not stored")
        return
    numbers = [n for n, _ in chunk.rounds]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"{chunk.name}: repair rounds {numbers}, not 1 to {len(numbers)}")
    counts.rounds += len(numbers)
    now = {str(row.get("id")): row for row in chunk.rows}  # the current record of each id
    cut = {sid for sid, row in now.items() if is_cut(row)}
    for number, rows in chunk.rounds:
        where = chunk.round_name(number)
        for sid, times in Counter(str(row.get("id")) for row in rows).items():
            if times > 1:
                problems.append(f"{where}: {sid} written {times} times")
        for row in rows:
            sid = str(row.get("id"))
            before = now.get(sid)
            if before is None:
                problems.append(f"{where}: {sid} is not in {chunk.name}")
                continue
            if row.get("repair") != number:
                problems.append(f"{where}: {sid} names round {row.get('repair')}")
            problems.extend(f"{where}: {sid} {p}" for p in _replacement(before, row, counts))
            if is_cut(row) and not is_cut(before):
                cut.add(sid)  # a regenerated failure cut at max_tokens: a later round continues it
            now[sid] = row
    counts.cut += len(cut)
    for sid in cut:
        row = now[sid]
        if is_cut(row):
            counts.left_cut += 1
        elif _continued(row):
            counts.continued += 1
            counts.continuation_requests += len(last_turn(row).get("parts", [])) - 1


def _replacement(before: Row, after: Row, counts: RoundCounts) -> list[str]:
    """What is wrong with ``after`` replacing ``before`` in a round."""
    if before.get("status") != "ok":
        if before.get("failure") == "permanent":
            return ["rewrote a permanent failure (no --retry-failed in a chaos run)"]
        counts.transient_repaired += int(after.get("status") == "ok")
        return []
    if not is_cut(before):
        return [f"rewrote a record that needed no round ({before.get('finish_reason')})"]
    if after.get("status") != "ok":
        return ["turned a cut thought into a failure: the thought is lost"]
    if is_cut(after):
        if _plain(last_turn(after)) != _plain(last_turn(before)):
            return ["left the cut thought cut, but not as it was"]
        counts.continuations_failed += 1
        return []
    return joined_problems(last_turn(before), last_turn(after))


def joined_problems(cut: Row, turn: Row) -> list[str]:
    """How ``turn`` fails to be ``cut`` continued: its parts joined, the cut turn's first."""
    parts = turn.get("parts") or []
    earlier = cut.get("parts") or [_as_part(cut)]
    problems = []
    if len(parts) <= len(earlier) or [_part(p) for p in parts[: len(earlier)]] != [_part(p) for p in earlier]:
        problems.append("continued turn does not start with the cut turn's parts")
    reasoning, content = turn.get("reasoning", ""), turn.get("content", "")
    if not reasoning.startswith(cut.get("reasoning", "")) or not content.startswith(cut.get("content", "")):
        problems.append("continued turn lost the text of the cut thought")
    if sum(p.get("reasoning_chars", 0) for p in parts) != len(reasoning) or sum(
        p.get("content_chars", 0) for p in parts
    ) != len(content):
        problems.append("continued turn's parts do not add up to its text")
    if sum(_tokens(p) for p in parts) != _tokens(turn):
        problems.append("continued turn's parts do not add up to its completion tokens")
    stops = [p.get("finish_reason") for p in parts]
    if any(s != "length" for s in stops[:-1]) or (parts and stops[-1] != turn.get("finish_reason")):
        problems.append(f"continued turn's parts end as {stops}, the turn as {turn.get('finish_reason')}")
    return problems


def is_cut(row: Row) -> bool:
    """An ok record whose last turn stopped at ``max_tokens`` inside its thought (no answer yet)."""
    turn = last_turn(row)
    return (
        row.get("status") == "ok"
        and turn.get("status") == "ok"
        and turn.get("finish_reason") == "length"
        and bool(str(turn.get("reasoning", "")).strip())
        and not str(turn.get("content", "")).strip()
    )


def last_turn(row: Row) -> Row:
    turns = row.get("turns") or [{}]
    return dict(turns[-1])


def _continued(row: Row) -> bool:
    return len(last_turn(row).get("parts") or []) > 1


def _tokens(doc: Row) -> int:
    return int((doc.get("usage") or {}).get("completion_tokens", 0))


def _plain(turn: Row) -> Row:
    """The turn without its quality checks (a round runs them again)."""
    return {k: v for k, v in turn.items() if k != "checks"}


def _as_part(turn: Row) -> Row:
    """A turn of one request as the part a continuation keeps first."""
    return {
        "reasoning_chars": len(turn.get("reasoning", "")),
        "content_chars": len(turn.get("content", "")),
        "finish_reason": turn.get("finish_reason"),
        "usage": turn.get("usage"),
    }


def _part(part: Row) -> Row:
    return {k: part.get(k) for k in ("reasoning_chars", "content_chars", "finish_reason", "usage")}
