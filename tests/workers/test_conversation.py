"""Multi-turn generation through the real request pool and real HTTP to the in-process simulator.

The simulator records every request body it receives (``record_requests``), so these tests check
what was really sent: one request per user turn, in order, each carrying the model's own earlier
answers (text only) and never the source's old ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dflash_tasks.core.conversation import blank_answers
from dflash_tasks.core.errors import ServerUnavailable
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.sample import Sample
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from dflash_tasks.sim.requestlog import read_requests
from tests.workers.conversation_support import generate_sample
from workers.flow.request_pool import RequestPool
from workers.generate.conversation import start_conversation
from workers.generation import RetryPolicy, WorkerIdentity
from workers.sglang_client import ChatRequest, Completion, SGLangClient

WHO = WorkerIdentity(worker="gpu0@test", endpoint="http://sim")
POLICY = RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.002)
SPEC = GenerationSpec("Qwen/Qwen3-8B", max_tokens=1000)
SYSTEM = {"role": "system", "content": "Be brief."}


def conversation(tag: str, turns: int, long_turn: int | None = None) -> list[dict[str, str]]:
    """System, then ``turns`` user turns, each followed (but the last) by an old answer."""
    messages = [SYSTEM]
    for j in range(1, turns + 1):
        text = "x " * 2000 if j == long_turn else f"{tag}: question {j}"
        messages.append({"role": "user", "content": text})
        if j < turns:
            messages.append({"role": "assistant", "content": f"OLD ANSWER {tag}-{j}"})
    return messages


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[RunningSimulator]:
    running = start_simulator(
        SimConfig(
            port=0,
            time_scale=0.0,
            mean_output_tokens=300,
            output_tokens_sigma=0.0,
            context_length=2000,
            record_requests=str(tmp_path / "requests.jsonl"),
        )
    )
    yield running
    running.stop()


def sent(sim: RunningSimulator) -> list[dict[str, Any]]:
    path = sim.engine.config.record_requests
    assert path is not None
    return read_requests(path)


def staged(sample_id: str, messages: list[dict[str, str]], line: int) -> Sample:
    return Sample(sample_id, blank_answers(messages), line)  # as staging writes it for turns: all


def test_one_two_and_three_turn_conversations_through_the_pool(sim: RunningSimulator) -> None:
    pool = RequestPool(2)
    client = SGLangClient(sim.url)
    samples = [staged(f"s{k}", conversation(f"c{k}", k), line=k) for k in (1, 2, 3)]
    try:
        futures = [start_conversation(pool, client, SPEC, s, WHO, POLICY, "job-0") for s in samples]
        records = [f.result(timeout=30) for f in futures]
    finally:
        pool.shutdown()
    assert [(r.user_turns, len(r.turns), r.outcome) for r in records] == [
        (1, 1, "complete"),
        (2, 2, "complete"),
        (3, 3, "complete"),
    ]
    bodies = sent(sim)
    assert not any("OLD ANSWER" in str(b["messages"]) for b in bodies)
    for record in records:
        mine = sorted((b for b in bodies if f"-L{record.line}-" in b["rid"]), key=lambda b: b["rid"])
        assert len(mine) == record.user_turns  # one request per user turn
        for j, body in enumerate(mine):
            assert body["rid"].endswith(f"-T{j + 1}-1")
            answers = [m for m in body["messages"] if m["role"] == "assistant"]
            # each later request carries the model's own earlier answers, text only, no reasoning
            assert answers == [{"role": "assistant", "content": t.content} for t in record.turns[:j]]
            assert all(t.reasoning not in str(body) for t in record.turns[:j])
            assert body["messages"][-1] == {
                "role": "user",
                "content": f"c{record.user_turns}: question {j + 1}",
            }
        assert record.turns[0].input[0] == SYSTEM and all(len(t.input) == 1 for t in record.turns[1:])
    assert pool.waiting == 0 and pool.running == 0


def test_a_failure_on_turn_two_of_three_ends_the_conversation_with_its_index(sim: RunningSimulator) -> None:
    sample = staged("long", conversation("L", 3, long_turn=2), line=4)
    record = generate_sample(SGLangClient(sim.url), SPEC, sample, WHO, POLICY, "job-0")
    assert (record.status, record.outcome, record.failed_turn) == ("failed", "failed", 2)
    assert record.error.startswith("turn 2 of 3: HTTP 400: Requested token count exceeds")
    first, second = record.turns
    assert first.status == "ok" and first.content and second.status == "failed"
    assert [b["rid"] for b in sent(sim)] == ["job-0-L4-T1-1", "job-0-L4-T2-1"]  # turn 3 never sent


def test_a_truncated_turn_keeps_the_conversation_up_to_it(sim: RunningSimulator) -> None:
    sample = staged("cut", conversation("T", 3), line=5)
    record = generate_sample(
        SGLangClient(sim.url), GenerationSpec("m", max_tokens=100), sample, WHO, POLICY, "job-0"
    )
    assert (record.status, record.outcome, record.failed_turn) == ("ok", "truncated", None)
    assert len(record.turns) == 1 and record.turns[0].finish_reason == "length"
    assert len(sent(sim)) == 1


def test_turns_last_sends_the_source_history_as_is_once(sim: RunningSimulator) -> None:
    messages = conversation("H", 3)
    spec = GenerationSpec("m", max_tokens=1000, turns="last")
    record = generate_sample(SGLangClient(sim.url), spec, Sample("h", messages, 6), WHO, POLICY, "job-0")
    (body,) = sent(sim)
    assert body["messages"] == messages and "OLD ANSWER H-2" in str(body)
    assert (record.user_turns, len(record.turns), list(record.turns[0].input)) == (1, 1, messages)


class DyingClient(SGLangClient):
    """The real client; after its first answer the server starts resetting and fails its health check."""

    def __init__(self, sim: RunningSimulator) -> None:
        super().__init__(sim.url)
        self._sim = sim
        self.answers = 0

    def chat(self, request: ChatRequest) -> Completion:
        completion = super().chat(request)
        self.answers += 1
        if self.answers == 1:
            for kind in ("unhealthy", "reset"):
                requests.post(
                    f"{self._sim.url}/sim/faults", json={"kind": kind}, timeout=5
                ).raise_for_status()
        return completion


def test_a_dead_server_on_a_later_turn_fails_the_sample_future(sim: RunningSimulator) -> None:
    pool = RequestPool(2)
    try:
        future = start_conversation(
            pool, DyingClient(sim), SPEC, staged("d", conversation("D", 2), 7), WHO, POLICY, "job-0"
        )
        with pytest.raises(ServerUnavailable, match="unhealthy"):
            future.result(timeout=30)
    finally:
        pool.shutdown()


def test_cancelled_conversations_send_no_further_turn(tmp_path: Path) -> None:
    slow = start_simulator(
        SimConfig(
            port=0,
            time_scale=1.0,
            tokens_per_second=1000,
            mean_output_tokens=300,
            output_tokens_sigma=0.0,
            record_requests=str(tmp_path / "slow.jsonl"),
        )
    )
    pool = RequestPool(1)
    try:
        client = SGLangClient(slow.url)
        futures = [
            start_conversation(
                pool, client, SPEC, staged(f"s{i}", conversation(f"c{i}", 3), i), WHO, POLICY, "j"
            )
            for i in range(3)
        ]
        deadline = time.monotonic() + 10
        while pool.running < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.running == 1 and pool.waiting == 2
        assert all(f.cancel() for f in futures)
        deadline = time.monotonic() + 10
        while pool.running and time.monotonic() < deadline:  # the running turn finishes ...
            time.sleep(0.01)
        time.sleep(0.1)
        assert pool.running == 0 and pool.waiting == 0
        assert len(read_requests(tmp_path / "slow.jsonl")) == 1  # ... and no next turn follows it
    finally:
        pool.shutdown()
        slow.stop()
