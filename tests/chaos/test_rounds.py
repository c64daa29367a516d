"""The checker over repair rounds: current records as ``read_current`` reads them, and each planted
defect of a round (a sample written twice, a sample lost, a cut thought lost or badly joined)
breaks an invariant, where accounting the current records by id alone sees nothing wrong."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from dflash_tasks.core.continuation import joined
from dflash_tasks.core.record import Turn, Usage
from dflash_tasks.core.states import RecordStatus
from tests.chaos import checker, rounds
from tests.chaos.rounds import ChunkFiles

CUT = Turn(
    input=({"role": "user", "content": "q"},),
    reasoning="<think>\nokay let me think",
    finish_reason="length",
    usage=Usage(12, 208, 208),
    status=RecordStatus.OK,
    attempts=1,
)
DONE = joined(CUT, " about it more", "the answer", "stop", Usage(19, 30, 25), None, 0.4, 1)
COMPLETE = dataclasses.replace(CUT, reasoning="a thought", content="an answer", finish_reason="stop")


def record(
    sid: str, turn: Turn | None, repair: int | None = None, checks: list[str] | None = None
) -> dict[str, Any]:
    """An output record of one turn (None: failed by a passing cause)."""
    if turn is None:
        return {"id": sid, "status": "failed", "failure": "transient", "turns": [], "repair": repair}
    doc = turn.to_dict()
    if checks is not None:
        doc["checks"] = checks
    return {"id": sid, "status": "ok", "finish_reason": turn.finish_reason, "turns": [doc], "repair": repair}


def chunk(*rounds_rows: list[dict[str, Any]]) -> ChunkFiles:
    """chunk-000000: s0 complete, s1 cut, s2 failed, s3 cut; then the given rounds."""
    rows = [record("s0", COMPLETE), record("s1", CUT), record("s2", None), record("s3", CUT)]
    return ChunkFiles("chunk-000000.jsonl", rows, [(i + 1, r) for i, r in enumerate(rounds_rows)])


ROUND_1 = [record("s1", DONE, 1), record("s2", COMPLETE, 1), record("s3", CUT, 1, checks=["truncated"])]
ROUND_2 = [record("s3", DONE, 2)]


def test_rounds_that_continue_and_regenerate_break_nothing_and_are_counted() -> None:
    files = [chunk(ROUND_1, ROUND_2)]
    counts, problems = rounds.check_rounds(files)
    assert problems == []
    assert dataclasses.astuple(counts) == (2, 2, 2, 1, 0, 2, 1)
    current = list(rounds.current_records(files))
    assert [(r["id"], r["repair"]) for r in current] == [("s0", None), ("s1", 1), ("s2", 1), ("s3", 2)]
    assert checker.account({"s0", "s1", "s2", "s3"}, current).stored_once == 4


def test_a_round_that_writes_a_sample_twice_breaks_an_invariant_the_accounting_misses() -> None:
    files = [chunk([*ROUND_1, record("s1", DONE, 1)], ROUND_2)]
    acc = checker.account({"s0", "s1", "s2", "s3"}, list(rounds.current_records(files)))
    assert (acc.stored_once, acc.duplicated) == (4, 0)  # by id, the current records look right
    _, problems = rounds.check_rounds(files)
    assert "chunk-000000.repair-1.jsonl: s1 written 2 times" in problems
    # ... and the second copy rewrote a record that needed no round any more
    assert any("s1 rewrote a record that needed no round (stop)" in p for p in problems), problems


def test_a_round_that_writes_one_sample_under_another_id_loses_a_sample() -> None:
    lost = [{**record("s1", DONE, 1), "id": "s0"}, record("s2", COMPLETE, 1), record("s3", DONE, 1)]
    files = [chunk(lost)]
    acc = checker.account({"s0", "s1", "s2", "s3"}, list(rounds.current_records(files)))
    assert (acc.stored_once, acc.lost, acc.duplicated) == (4, 0, 0)
    counts, problems = rounds.check_rounds(files)
    assert problems == ["chunk-000000.repair-1.jsonl: s0 rewrote a record that needed no round (stop)"]
    assert (counts.cut, counts.continued, counts.left_cut) == (2, 1, 1)  # s1's thought stays cut


def test_a_continuation_that_loses_the_cut_thought_or_misjoins_its_parts_breaks_invariants() -> None:
    shorter = dataclasses.replace(DONE, reasoning=DONE.reasoning[5:])  # the cut thought's start lost
    no_first = dataclasses.replace(DONE, parts=DONE.parts[1:])  # the first request's part dropped
    tokens = dataclasses.replace(DONE, usage=Usage(12, 999, 233))
    failed = record("s3", None, 1)
    problems = rounds.check_rounds(
        [chunk([record("s1", shorter, 1), failed]), chunk([record("s1", no_first, 1)])]
    )[1]
    problems += rounds.check_rounds([chunk([record("s1", tokens, 1)])])[1]
    assert problems == [
        "chunk-000000.repair-1.jsonl: s1 continued turn lost the text of the cut thought",
        "chunk-000000.repair-1.jsonl: s1 continued turn's parts do not add up to its text",
        "chunk-000000.repair-1.jsonl: s3 turned a cut thought into a failure: the thought is lost",
        "chunk-000000.repair-1.jsonl: s1 continued turn does not start with the cut turn's parts",
        "chunk-000000.repair-1.jsonl: s1 continued turn's parts do not add up to its text",
        "chunk-000000.repair-1.jsonl: s1 continued turn's parts do not add up to its completion tokens",
        "chunk-000000.repair-1.jsonl: s1 continued turn's parts do not add up to its completion tokens",
    ]


def test_a_round_of_an_unknown_sample_a_gap_in_the_rounds_and_a_wrong_round_number_break_invariants() -> None:
    files = [chunk([record("x9", DONE, 1)], [], [record("s1", DONE, 2)])]
    files[0].rounds = [files[0].rounds[0], files[0].rounds[2]]  # rounds 1 and 3
    problems = rounds.check_rounds(files)[1]
    assert problems == [
        "chunk-000000.jsonl: repair rounds [1, 3], not 1 to 2",
        "chunk-000000.repair-1.jsonl: x9 is not in chunk-000000.jsonl",
        "chunk-000000.repair-3.jsonl: s1 names round 2",
    ]
    orphan = ChunkFiles("chunk-000007.jsonl", [], [(1, [record("s1", DONE, 1)])])
    assert rounds.check_rounds([orphan])[1] == [
        "chunk-000007.repair-1.jsonl: a repair round of a chunk not stored"
    ]


class Folder:
    """The store as the checker reads it: a folder of chunk and repair files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def chunk_versions(self) -> dict[str, str]:
        return {p.name: str(p.stat().st_mtime_ns) for p in self.root.iterdir()}

    def read(self, key: str) -> bytes | None:
        path = self.root / key.removeprefix("outputs/")
        return path.read_bytes() if path.exists() else None


def test_the_files_are_read_as_read_current_reads_them(tmp_path: Path) -> None:
    def write(name: str, rows: list[dict[str, Any]]) -> None:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    base = chunk(ROUND_1, ROUND_2)
    write("chunk-000000.jsonl", base.rows)
    write("chunk-000000.repair-2.jsonl", ROUND_2)  # round 2 is applied after round 1, not by name
    write("chunk-000000.repair-1.jsonl", ROUND_1)
    write("chunk-000001.jsonl", [record("s4", COMPLETE)])
    files = rounds.load(Folder(tmp_path))
    assert [(f.name, [n for n, _ in f.rounds]) for f in files] == [
        ("chunk-000000.jsonl", [1, 2]),
        ("chunk-000001.jsonl", []),
    ]
    current = list(rounds.current_records(files))
    assert [(r["id"], r["repair"]) for r in current] == [
        ("s0", None),
        ("s1", 1),
        ("s2", 1),
        ("s3", 2),
        ("s4", None),
    ]
    assert rounds.check_rounds(files) == rounds.check_rounds([chunk(ROUND_1, ROUND_2), files[1]])


def ev(t: float, event_type: str, /, **data: Any) -> dict[str, Any]:
    return {"t": t, "type": event_type, **data}


def test_the_faults_in_effect_while_the_repair_rounds_ran_are_counted() -> None:
    events = [
        ev(1.0, "fault_start", index=0, kind="worker_kill"),
        ev(6.0, "recovered", index=0, kind="worker_kill"),  # in effect until it recovered: 1 to 6 s
        ev(7.0, "fault_start", index=3, kind="worker_kill"),
        ev(9.0, "recovered", index=3, kind="worker_kill"),  # 7 to 9 s: while round 1 ran
        ev(2.0, "fault_start", index=1, kind="store_fail"),
        ev(9.0, "fault_stop", index=1, kind="store_fail"),
        ev(9.5, "recovered", index=1, kind="store_fail"),
        ev(12.0, "fault_start", index=2, kind="sim_fault"),
        ev(14.0, "fault_stop", index=2, kind="sim_fault"),
        ev(8.0, "repair_round", what="repair round 1 of at most 3: ..."),
        ev(10.5, "repair_stored", chunk="chunk-000003.repair-1.jsonl"),
    ]
    assert checker.repair_overlap(events) == ([8.0, 10.5], {"worker_kill": 1, "store_fail": 1})
    assert checker.repair_overlap(events[:9]) == ([], {})


def test_the_export_has_every_sample_once_written_or_dropped_and_each_continued_turn_joined() -> None:
    def row(sid: str, turn: Turn) -> dict[str, Any]:
        answer = {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning}
        return {"id": sid, "messages": [{"role": "user", "content": "q"}, answer]}

    files = [chunk(ROUND_1, ROUND_2)]
    continued = rounds.continued_turns(files)
    assert sorted(continued) == ["s1", "s3"] and continued["s1"] == (DONE.reasoning, DONE.content)
    rows = [row("s0", COMPLETE), row("s1", DONE), row("s2", COMPLETE), row("s3", DONE)]
    expected = {"s0", "s1", "s2", "s3", "s4"}
    dropped = [{"id": "s4", "reason": "truncated"}]  # an answer cut at max_tokens: not continued
    assert checker.export_problems(rows, dropped, expected, continued) == []
    assert checker.export_problems(rows, [], expected, continued) == [
        "export: 4 rows and 0 dropped, 0 duplicates, 1 samples missing"
    ]
    assert checker.export_problems([*rows, rows[1]], dropped, expected, continued) == [
        "export: 5 rows and 1 dropped, 1 duplicates, 0 samples missing"
    ]
    first_part_only = [*rows[:3], row("s3", CUT)]
    assert checker.export_problems(first_part_only, dropped, expected, continued) == [
        "export: the row of continued sample s3 is not its joined turn"
    ]
    assert checker.export_problems(
        rows[:3], [*dropped, {"id": "s3", "reason": "truncated"}], expected, continued
    ) == ["export: continued sample s3 not written"]
