"""Multi-turn conversations end to end: real Redis, Celery workers and simulators over HTTP.

The simulator records every request body (``--record-requests``), so the tests check what the
workers really sent: one request per user turn, none carrying a source answer, each later one
carrying the model's own earlier answers.
"""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from dflash_tasks.sim.requestlog import read_requests
from tests.e2e.test_pipeline_e2e import enqueue_args, last_json, verify_ok
from tests.helpers import Processes, done_chunk_count, read_records, wait_until
from tests.output.specforge_rules import validate_file

SYSTEM = {"role": "system", "content": "You are terse."}


def write_conversations(path: Path, count: int, failing: int | None = None) -> dict[str, int]:
    """``count`` samples with 1, 2 or 3 user turns (and the source's old answers); returns id -> turns.

    Sample ``failing`` (3 turns) has a second user turn too long for the context: turn 2 fails.
    """
    turns_of: dict[str, int] = {}
    with open(path, "w") as fh:
        for i in range(count):
            turns = 1 + i % 3
            sid = f"c{i}"
            messages: list[dict[str, str]] = [SYSTEM] if i % 2 else []
            for j in range(1, turns + 1):
                text = (
                    "x " * 16_000 if (i == failing and j == 2) else f"{sid}: question {j}, what is {i} * {j}?"
                )
                messages.append({"role": "user", "content": text})
                messages.append({"role": "assistant", "content": f"OLD ANSWER {sid}-{j}"})
            if i % 4 == 1:  # ShareGPT shape
                doc: dict[str, Any] = {
                    "id": sid,
                    "conversations": [
                        {
                            "from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                            "value": m["content"],
                        }
                        for m in messages
                    ],
                }
            else:
                doc = {"id": sid, "messages": messages}
            fh.write(json.dumps(doc) + "\n")
            turns_of[sid] = turns
    return turns_of


def requests_by_line(bodies: list[dict[str, Any]], job_id: str) -> dict[int, list[dict[str, Any]]]:
    """One job's request bodies by input line, in turn order.

    A rid reads ``JOB-CHUNK-OWNER-L<line>-T<turn>-<attempt>``.
    """
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for body in bodies:
        rid = str(body.get("rid") or "")
        if rid.startswith(job_id):
            _, line, turn, _attempt = rid.rsplit("-", 3)
            out[int(line[1:])].append({**body, "turn": int(turn[1:])})
    return {line: sorted(items, key=lambda b: b["turn"]) for line, items in out.items()}


def test_conversations_of_one_two_and_three_turns_are_regenerated_turn_by_turn(
    procs: Processes, tmp_path: Path
) -> None:
    inp, out, log = tmp_path / "convos.jsonl", tmp_path / "out", tmp_path / "requests.jsonl"
    turns_of = write_conversations(inp, 60, failing=5)
    sim = procs.simulator(
        "--time-scale",
        "0.001",
        "--mean-output-tokens",
        "1500",
        "--context-length",
        "8192",
        "--record-requests",
        str(log),
    )
    procs.worker(sim, "gpu0")
    # the trainer's horizon at the budget: no cut thought is continued (test_repair_runner's subject)
    args = enqueue_args(
        inp,
        out,
        "--chunk-size",
        "8",
        "--max-tokens",
        "2500",
        "--train-max-length",
        "2500",
        "--preflight",
        "16",
    )
    args += ["--wait", "--json"]
    res = procs.run("dflash_tasks.producer.enqueue", *args)
    assert res.returncode == 0, res.stderr
    summary = last_json(res.stdout)
    assert summary["samples"] == 60 and summary["turns"] == sum(turns_of.values()) == 120
    assert "60 samples (120 turns)" in res.stderr
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["turns"] > preflight["samples"] and preflight["multi_turn_samples"] > 0
    assert preflight["projected_turns_per_s"] > 0 and preflight["remaining_turns"] > 0

    report = verify_ok(procs, inp, out)
    assert report["turns_expected"] == 120 and report["turn_mismatches"] == 0
    records = {r["id"]: r for r in read_records(out)}
    assert len(records) == 60
    assert report["turns_generated"] == sum(len(r["turns"]) for r in records.values())
    assert report["turns_generated"] + report["turns_not_sent"] == 120

    # What was sent: per sample, one request per turn it generated (retries aside), in order.
    job_id = str(summary["job_id"])
    sent = requests_by_line(read_requests(log), job_id)
    bodies = [b for items in sent.values() for b in items]
    assert bodies and not any("OLD ANSWER" in json.dumps(b["messages"]) for b in bodies)
    complete = [r for r in records.values() if r["outcome"] == "complete"]
    assert {r["user_turns"] for r in complete} == {1, 2, 3} and len(complete) >= 40
    for record in records.values():
        assert record["user_turns"] == turns_of[record["id"]]
        mine = sent[record["line"]]
        assert [b["turn"] for b in mine] == list(range(1, len(record["turns"]) + 1))  # no retries here
        if record["outcome"] == "complete":
            assert len(mine) == record["user_turns"]
        for j, body in enumerate(mine):
            own = [{"role": "assistant", "content": t["content"]} for t in record["turns"][:j]]
            assert [m for m in body["messages"] if m["role"] == "assistant"] == own
            assert body["messages"][-1] == record["turns"][j]["input"][-1]
            question = f"{record['id']}: question {j + 1}"
            assert body["messages"][-1]["content"].startswith(question) or record["id"] == "c5"
    failed = records["c5"]
    assert (failed["status"], failed["failed_turn"], len(failed["turns"])) == ("failed", 2, 2)
    assert failed["error"].startswith("turn 2 of 3: HTTP 400") and len(sent[failed["line"]]) == 2

    status = procs.run("dflash_tasks.monitoring.status", "--output", str(out), "--json")
    doc = last_json(status.stdout)
    assert doc["turns"]["total"] == 120 and doc["turns"]["done"] == 120 and doc["eta_unit"] == "turns"
    assert doc["turns"]["generated"] == report["turns_generated"]

    # The validator mode's export is one SpecForge's validator accepts; the rejects are counted.
    train = tmp_path / "train.jsonl"
    exp = procs.run(
        "dflash_tasks.output.export", "--output", str(out), "--to", str(train), "--mode", "validator"
    )
    assert exp.returncode == 0, exp.stderr
    manifest = json.loads((tmp_path / "train.jsonl.manifest.json").read_text())
    checked = validate_file(train, expect_reasoning=True, strict_think_markers=True)
    assert checked.rows == manifest["rows"] and checked.assistant_messages == manifest["assistant_turns"]
    assert 0 < manifest["multi_turn_rows"] < manifest["rows"]  # a mixed single- and multi-turn file
    assert manifest["rows"] + sum(manifest["dropped"].values()) == 60
    assert manifest["dropped"]["failed"] == 1 and set(manifest["dropped"]) <= {
        "failed",
        "truncated",
        "empty_answer",
    }
    for reason, n in manifest["dropped"].items():
        assert f"  {reason:<22} {n:>8,}" in exp.stderr

    # --turns last keeps the old behaviour; a re-run with another turns value is refused.
    refused = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(inp, out, "--chunk-size", "8", "--turns", "last")
    )
    assert (
        refused.returncode == 2 and "turns: the output has 'all', this run asks for 'last'" in refused.stderr
    )
    last_out = tmp_path / "last"
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(
            inp,
            last_out,
            "--chunk-size",
            "8",
            "--max-tokens",
            "2500",
            "--train-max-length",
            "2500",
            "--turns",
            "last",
            "--no-preflight",
            "--wait",
            "--json",
        ),
    )
    assert res.returncode == 0, res.stderr
    last_summary = last_json(res.stdout)
    assert last_summary["turns"] == 60 and last_summary["job_id"] != job_id
    report = verify_ok(procs, inp, last_out)
    assert report["turns_expected"] == 60
    last_sent = requests_by_line(read_requests(log), str(last_summary["job_id"]))
    for record in read_records(last_out):
        (body,) = last_sent[record["line"]]
        history = [m for m in body["messages"] if m["role"] == "assistant"]
        k = turns_of[record["id"]]
        assert [m["content"] for m in history] == [f"OLD ANSWER {record['id']}-{j}" for j in range(1, k)]
        assert record["user_turns"] == 1 and len(record["turns"]) == 1


def test_a_worker_killed_mid_conversation_stores_every_turn_once(procs: Processes, tmp_path: Path) -> None:
    inp, out, log = tmp_path / "convos.jsonl", tmp_path / "out", tmp_path / "requests.jsonl"
    turns_of = write_conversations(inp, 90)
    sim = procs.simulator(
        "--time-scale",
        "0.02",
        "--mean-output-tokens",
        "500",
        "--output-tokens-sigma",
        "0.1",
        "--record-requests",
        str(log),
    )
    victim = procs.worker(sim, "victim")
    procs.worker(sim, "survivor")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *enqueue_args(inp, out, "--chunk-size", "9", "--no-preflight", "--json"),
    )
    assert res.returncode == 0, res.stderr
    job_id = str(last_json(res.stdout)["job_id"])
    owners_key = f"t-{procs.queue}:job:{job_id}:owners"
    r = redis.Redis.from_url(procs.broker_url)

    def victim_mid_conversation() -> list[int]:
        held = {int(c) for c, o in r.hgetall(owners_key).items() if o.startswith(b"victim@")}
        later = {int(str(b["rid"]).split("-")[1]) for b in read_requests(log) if "-T2-" in str(b.get("rid"))}
        return sorted(held & later)

    held = wait_until(victim_mid_conversation, 30, "a victim chunk with a second turn sent")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    wait_until(lambda: done_chunk_count(out) == 10, 120, "all 10 chunks done")
    report = verify_ok(procs, inp, out)
    assert report["ok"] == 90 and report["duplicated"] == 0 and report["turn_mismatches"] == 0
    records = read_records(out)
    assert len({r["id"] for r in records}) == len(records) == 90
    for record in records:  # every turn stored once: as many turns as the conversation has
        assert record["outcome"] == "complete" and len(record["turns"]) == turns_of[record["id"]]
    for chunk in held:  # those conversations were started again by the survivor, and stored by it only
        stored = [r for r in records if (r["line"] - 1) // 9 == chunk]
        assert stored and all(r["worker"].startswith("survivor@") for r in stored)
        first_turns = [
            b
            for b in read_requests(log)
            if f"{job_id}-{chunk}-" in str(b.get("rid")) and "-T1-" in str(b["rid"])
        ]
        assert len(first_turns) > len(stored)  # sent by both workers, stored once
