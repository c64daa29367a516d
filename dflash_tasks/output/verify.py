"""``python -m dflash_tasks.verify``: check that every input sample is in the output exactly once.

Exit status 0 only when every valid input sample appears exactly once (ok or failed), nothing
else is in the output, and every invalid line is reported: ``ok + failed + invalid == lines``.
Turns are accounted too: each record holds one answered turn per request sent for its sample,
as many as its user turns (fewer only when its last turn failed or was truncated, which ended the
conversation), and never a hole.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from dflash_tasks.core.conversation import can_continue, count_turns
from dflash_tasks.core.errors import BadRecord, CorruptObject, DflashError
from dflash_tasks.core.job import OUTPUTS_PREFIX, parse_chunk_key
from dflash_tasks.core.record import Record
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.producer.inputs import InvalidLine, read_input
from dflash_tasks.producer.staging import read_invalid
from dflash_tasks.store import Store, open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest


@dataclass(slots=True)
class Verification:
    lines: int = 0
    valid: int = 0
    invalid: int = 0
    invalid_reported: int = 0
    ok: int = 0
    failed: int = 0
    chunks: int = 0
    chunks_done: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    corrupted: int = 0
    turns_expected: int = 0  # user turns of the valid input samples (requests a full run sends)
    turns_generated: int = 0  # turns recorded: one request each
    turns_not_sent: int = 0  # turns of conversations that ended early (a failed or truncated turn)
    turn_mismatches: int = 0  # records whose turns do not match their input sample
    problems: list[str] = field(default_factory=list)
    missing_chunks: list[int] = field(default_factory=list)  # neither stored nor readable

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["passed"] = self.passed
        return doc


def verify(input_path: str, store: Store) -> Verification:
    """Account for every line of ``input_path`` in ``store``."""
    result = Verification()
    job, manifest = load_job(store), load_manifest(store)
    mode = job.spec.turns if job is not None else "all"
    expected: dict[str, int] = {}  # sample id -> its user turns
    lines: dict[str, int] = {}  # sample id -> its input line
    for item in read_input(input_path):
        result.lines = max(result.lines, item.line)
        if isinstance(item, InvalidLine):
            result.invalid += 1
        else:
            expected[item.id] = count_turns(item.messages, mode)
            lines[item.id] = item.line
    result.valid = len(expected)
    result.turns_expected = sum(expected.values())
    if job is None or manifest is None:
        result.problems.append(f"{store.uri} holds no staged job (run enqueue first)")
        result.missing = result.valid
        return result
    result.chunks = manifest.chunks
    result.invalid_reported = len(read_invalid(store))
    seen: Counter[str] = Counter()
    stored: set[int] = set()
    for key in sorted(store.list(OUTPUTS_PREFIX)):
        chunk = parse_chunk_key(key)
        if chunk is None:
            continue
        try:
            data = store.read(key)  # checks the object's recorded sha256 where the store keeps one
        except CorruptObject as exc:
            result.corrupted += 1
            result.problems.append(f"{exc}; delete it and re-run enqueue to generate the chunk again")
            continue
        result.chunks_done += 1
        stored.add(chunk)
        for number, raw in enumerate(data.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                record = Record.from_json(raw, f"{key}:{number}")
            except BadRecord as exc:  # named by place and cause; the lines after it still read
                result.problems.append(str(exc))
                continue
            seen[record.id] += 1
            _account_turns(result, record, expected.get(record.id), f"{key}:{number}")
            if record.ok:
                result.ok += 1
            else:
                result.failed += 1
    result.missing_chunks = [c for c in range(manifest.chunks) if c not in stored]
    missing = [sample_id for sample_id in expected if sample_id not in seen]
    duplicates = {sample_id: n for sample_id, n in seen.items() if n > 1}
    unexpected = {sample_id: n for sample_id, n in seen.items() if sample_id not in expected}
    result.missing = len(missing)
    result.duplicated = sum(n - 1 for n in duplicates.values())
    result.unexpected = sum(unexpected.values())
    _judge(result, manifest.invalid, lines, missing, duplicates, unexpected)
    return result


def _account_turns(r: Verification, record: Record, wanted: int | None, where: str) -> None:
    """Count a record's turns; a record must have every turn up to the one that ended it."""
    turns = record.turns
    r.turns_generated += len(turns)
    if wanted is None:
        return
    ended_early = len(turns) < wanted and bool(turns) and not can_continue(turns[-1])
    whole = len(turns) == wanted or ended_early
    no_hole = all(can_continue(t) for t in turns[:-1])
    if whole and no_hole:
        r.turns_not_sent += wanted - len(turns)
        return
    r.turn_mismatches += 1
    if r.turn_mismatches <= 5:
        r.problems.append(
            f"{where}: sample {record.id!r} has {len(turns)} turns recorded for {wanted} user turns"
            + ("" if no_hole else ", with an unfinished turn before its last")
        )


#: How many ids (or chunks) a problem names before it says "and N more".
SHOWN = 5


def _names(items: list[str]) -> str:
    more = len(items) - SHOWN
    return ", ".join(items[:SHOWN]) + (f" and {more:,} more" if more > 0 else "")


def _judge(
    r: Verification,
    staged_invalid: int,
    lines: dict[str, int],
    missing: list[str],
    duplicates: dict[str, int],
    unexpected: dict[str, int],
) -> None:
    if missing:
        where = (
            f"chunks not stored: {_names([str(c) for c in r.missing_chunks])}"
            if r.missing_chunks
            else "their chunks are stored without them"
        )
        named = [f"{sample_id} (line {lines[sample_id]})" for sample_id in missing[:SHOWN]]
        named += missing[SHOWN:]  # counted, not shown
        r.problems.append(f"{len(missing)} input samples have no output record ({where}): {_names(named)}")
    if duplicates:
        counts = [f"{sample_id} x{n}" for sample_id, n in duplicates.items()]
        r.problems.append(f"{r.duplicated} duplicate output records: {_names(counts)}")
    if unexpected:
        r.problems.append(
            f"{r.unexpected} output records whose id is not in the input: {_names(list(unexpected))}"
        )
    if r.invalid != r.invalid_reported or r.invalid != staged_invalid:
        r.problems.append(
            f"{r.invalid} invalid input lines, but {r.invalid_reported} reported in invalid.jsonl "
            f"and {staged_invalid} in the manifest"
        )
    if r.turn_mismatches > 5:
        r.problems.append(f"{r.turn_mismatches} records in all have turns that do not match their input")
    if not r.problems and r.ok + r.failed + r.invalid != r.lines:
        r.problems.append(f"ok {r.ok} + failed {r.failed} + invalid {r.invalid} != {r.lines} input lines")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.verify", description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="the prompts file the job was enqueued with")
    p.add_argument(
        "--output", required=True, help="the job's output root (a directory or s3://bucket/prefix)"
    )
    p.add_argument(
        "--s3-endpoint-url", help="S3-compatible endpoint for s3:// outputs [DFLASH_S3_ENDPOINT_URL]"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    try:
        settings = CommonSettings.load(s3_endpoint_url=args.s3_endpoint_url)
        result = verify(args.input, open_store(args.output, settings))
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        status = "PASS" if result.passed else "FAIL"
        print(
            f"{status}: {result.lines:,} lines = {result.ok:,} ok + {result.failed:,} failed + "
            f"{result.invalid:,} invalid; chunks {result.chunks_done:,}/{result.chunks:,}; "
            f"missing {result.missing:,}, duplicated {result.duplicated:,}"
            + (f", corrupted {result.corrupted:,}" if result.corrupted else "")
            + f"\n      turns: {result.turns_generated:,} generated of {result.turns_expected:,} user turns"
            f" ({result.turns_not_sent:,} not sent: their conversation ended at a failed or truncated turn)"
        )
        for problem in result.problems:
            print(f"  - {problem}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
