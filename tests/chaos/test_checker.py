"""The checker fails on each broken invariant, and the recorder sees what the checker needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from dflash_tasks.core.job import Manifest
from tests.chaos import checker
from tests.chaos.history import History, Recorder, _SimCounter
from tests.chaos.services import Output
from tests.helpers import RedisServer


def ev(t: float, event_type: str, /, **data: Any) -> dict[str, Any]:
    return {"t": t, "type": event_type, **data}


CLEAN = [
    ev(1.0, "chunk_stored", chunk="chunk-000000.jsonl", digest="aa", records=4),
    ev(1.5, "counters", done_chunks=1, samples=4, failed=0, store=[1, 4, 0]),
    ev(1.5, "progress", chunks=1, samples=4, failed=0, counted=4, state="running", store=[1, 4, 0]),
    ev(2.0, "verify", rc=1, duplicated=0, unexpected=0, corrupted=0),
]


def test_a_clean_history_breaks_nothing() -> None:
    assert checker.check_history(CLEAN) == []


def test_a_chunk_rewritten_with_other_bytes_breaks_an_invariant() -> None:
    bad = ev(9.0, "chunk_rewritten", chunk="chunk-000000.jsonl", first="aa", now="bb", records=4)
    problems = checker.check_history([*CLEAN, {**bad, "failed_before": 1, "failed_now": 0}])
    assert len(problems) == 1 and "chunk-000000.jsonl rewritten" in problems[0]


def test_counters_ahead_of_the_store_break_an_invariant() -> None:
    ahead = ev(3.0, "counters", done_chunks=2, samples=8, failed=1, store=[1, 4, 0])
    progress = ev(3.0, "progress", chunks=1, samples=4, failed=0, counted=5, state="running", store=[1, 4, 0])
    problems = checker.check_history([*CLEAN, ahead, progress])
    assert len(problems) == 4, problems
    assert any("Redis done chunks 2 > 1" in p for p in problems)
    assert any("progress.json tokens.counted_samples 5 > 4" in p for p in problems)


def test_a_vanished_or_unreadable_chunk_and_a_duplicate_seen_by_verify_break_invariants() -> None:
    events = [
        *CLEAN,
        ev(4.0, "chunk_vanished", chunk="chunk-000000.jsonl"),
        ev(4.0, "chunk_corrupt", chunk="chunk-000001.jsonl", size=10),
        ev(5.0, "verify", rc=1, duplicated=2, unexpected=0, corrupted=0),
    ]
    assert len(checker.check_history(events)) == 3


def test_accounting_counts_lost_duplicated_and_unexpected_samples() -> None:
    records = [{"id": "a", "status": "ok"}, {"id": "a", "status": "ok"}, {"id": "x", "status": "failed"}]
    acc = checker.account({"a", "b"}, records)
    assert (acc.stored_once, acc.lost, acc.duplicated, acc.unexpected, acc.failed) == (0, 1, 1, 1, 1)


def test_the_worst_recovery_is_the_longest_takeover_or_resume() -> None:
    events = [
        ev(1, "recovered", index=3, kind="worker_kill", victim_chunks=2, takeover_s=4.1, resume_s=0.5),
        ev(2, "recovered", index=5, kind="redis_flushall", victim_chunks=0, takeover_s=None, resume_s=6.0),
    ]
    rows, worst, which = checker.recoveries(events)
    assert len(rows) == 2 and worst == 6.0 and which == "redis_flushall #5"


def test_simulator_counters_survive_a_restart_of_the_simulator() -> None:
    c = _SimCounter()
    c.update({"requests_total": 10})
    c.update({"requests_total": 25})
    c.update({"requests_total": 3})  # a new process after a kill
    assert c.total("requests_total") == 28


class DirOutput(Output):
    """A plain folder as the store (the run uses a tmpfs; the recorder only lists and reads)."""

    kind = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def chunk_versions(self) -> dict[str, str]:
        folder = self.root / "outputs"
        out = {}
        for p in folder.iterdir() if folder.exists() else []:
            st = p.stat()
            out[p.name] = f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
        return out

    def read(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.exists() else None


class RedisOf:
    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def client(self) -> redis.Redis:
        return self.server.client()


def _records(*statuses: str) -> bytes:
    return b"".join(json.dumps({"id": f"s{i}", "status": s}).encode() + b"\n" for i, s in enumerate(statuses))


def test_the_recorder_sees_a_chunk_rewritten_with_other_bytes_and_counters_ahead_of_the_store(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    root = tmp_path / "out"
    (root / "outputs").mkdir(parents=True)
    (root / "job.json").write_text(json.dumps({"job_id": "j1"}))
    (root / "manifest.json").write_bytes(Manifest("j1", 8, 8, 0, 4, 2).to_json())
    history = History(tmp_path / "history.jsonl")
    rec = Recorder(
        history,
        DirOutput(root),
        RedisOf(redis_server),
        {},
        "chk",
        "q",
        ["true"],
        {},
        verify_every=1e9,
    )
    chunk = root / "outputs" / "chunk-000000.jsonl"
    chunk.write_bytes(_records("ok", "ok", "failed", "ok"))
    rec.sample()
    assert [e["records"] for e in history.of("chunk_stored")] == [4]
    r = redis_server.client()
    r.sadd("chk:job:j1:done", "0", "1")  # Redis says two chunks are done; the store has one
    r.hset("chk:job:j1:stats", mapping={"samples_ok": 3, "samples_failed": 1})
    tmp = chunk.with_name(".tmp")
    tmp.write_bytes(_records("ok", "ok", "ok", "ok"))  # a second writer replaces the file whole
    tmp.replace(chunk)
    rec.sample()
    problems = checker.check_history(history.events)
    assert any("rewritten" in p and "failed records 1 -> 0" in p for p in problems), problems
    assert any("Redis done chunks 2 > 1" in p for p in problems), problems
    assert any("Redis failed samples 1 > 0" in p for p in problems), problems
    history.close()
    r.delete("chk:job:j1:done", "chk:job:j1:stats")
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines].count("chunk_rewritten") == 1


def test_a_repair_file_is_no_chunk_and_its_records_replace_their_chunks(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    root = tmp_path / "out"
    (root / "outputs").mkdir(parents=True)
    (root / "job.json").write_text(json.dumps({"job_id": "j2"}))
    (root / "manifest.json").write_bytes(Manifest("j2", 4, 4, 0, 4, 1).to_json())
    history = History(tmp_path / "history.jsonl")
    output = DirOutput(root)
    rec = Recorder(history, output, RedisOf(redis_server), {}, "chk2", "q", ["true"], {}, verify_every=1e9)
    (root / "outputs" / "chunk-000000.jsonl").write_bytes(_records("ok", "failed", "failed", "ok"))
    repaired = json.dumps({"id": "s1", "status": "ok", "repair": 1}).encode() + b"\n"
    (root / "outputs" / "chunk-000000.repair-1.jsonl").write_bytes(repaired)
    rec.sample()
    assert [e["chunk"] for e in history.of("chunk_stored")] == ["chunk-000000.jsonl"]
    assert [e["chunk"] for e in history.of("repair_stored")] == ["chunk-000000.repair-1.jsonl"]
    assert rec.latest_store == (1, 4, 2) and rec.stored_chunks() == {0}
    records = list(output.records())
    assert [(r["id"], r["status"]) for r in records] == [
        ("s0", "ok"),
        ("s1", "ok"),
        ("s2", "failed"),
        ("s3", "ok"),
    ]
    assert checker.repair_counts(records) == (1, 1)  # s2 failed before failure kinds: counted transient
    # a second writer of round 1 (its lease lost with Redis) replaces the round's file: written twice
    again = json.dumps({"id": "s2", "status": "ok", "repair": 1}).encode() + b"\n"
    (root / "outputs" / "chunk-000000.repair-1.jsonl").write_bytes(repaired + again)
    rec.sample()
    problems = checker.check_history(history.events)
    assert len(problems) == 1 and "chunk-000000.repair-1.jsonl rewritten" in problems[0], problems
    history.close()


def test_the_producer_s_repair_rounds_are_read_from_its_log_once_each_whole_line(tmp_path: Path) -> None:
    from tests.chaos.cluster import Producer

    producer = Producer(tmp_path, {}, tmp_path / "in.jsonl", DirOutput(tmp_path), 4, 208)
    log = tmp_path / "producer.log"
    log.write_bytes(b" 50.0%|#####     | 2/4 samples\r100.0%|##########| 4/4 samples\nrepair round 1 of at")
    assert producer.repair_rounds() == []  # not a whole line yet
    with open(log, "ab") as fh:
        fh.write(b" most 3: 2 cut thoughts continued\nrepair: 1 rounds run; none left\n")
    assert producer.repair_rounds() == ["repair round 1 of at most 3: 2 cut thoughts continued"]
    assert producer.repair_rounds() == []
    argv = producer.argv()
    at = argv.index("--max-tokens")
    assert argv[at : at + 4] == ["--max-tokens", "208", "--train-max-length", "4096"]
