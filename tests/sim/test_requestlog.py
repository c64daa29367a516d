"""The simulator's request log (GET /sim/requests, --record-requests) and thinking default, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from dflash_tasks.sim.requestlog import RequestLog, RequestRecord, read_requests, sample_key


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_simulator(SimConfig(port=0, time_scale=0.0)) as running:
        yield running


def ask(url: str, text: str, **fields: Any) -> requests.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 3000, **fields}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=10)


def log(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = requests.get(f"{url}/sim/requests", timeout=5).json()
    return doc


def test_requests_are_counted_per_sample_and_repeats_are_wasted(sim: RunningSimulator) -> None:
    for text, rid in (("one", "a-1"), ("one", "a-2"), ("two", "b-1")):
        assert ask(sim.url, text, rid=rid, chat_template_kwargs={"enable_thinking": True}).ok
    assert ask(sim.url, "bad", top_p=7).status_code == 400  # rejected: not received
    doc = log(sim.url)
    one, two = sample_key([{"role": "user", "content": "one"}]), sample_key([{"content": "two"}])
    assert doc["per_sample"] == {
        one: {"received": 2, "generated": 2},
        two: {"received": 1, "generated": 1},
    }
    assert (doc["samples"], doc["received"], doc["generated"], doc["wasted"]) == (2, 3, 3, 1)
    assert [r["rid"] for r in doc["recent"]] == ["a-1", "a-2", "b-1"]
    first = doc["recent"][0]
    assert first["sample"] == one and first["chat_template_kwargs"] == {"enable_thinking": True}
    assert "messages" not in first and first["max_tokens"] == 3000
    requests.post(f"{sim.url}/sim/stats/reset", timeout=5).raise_for_status()
    assert log(sim.url) == {
        "samples": 0,
        "received": 0,
        "generated": 0,
        "wasted": 0,
        "truncated": False,
        "per_sample": {},
        "recent": [],
    }


def test_faults_count_as_generated_only_when_the_work_was_done(sim: RunningSimulator) -> None:
    key = sample_key([{"content": "q"}])
    requests.post(f"{sim.url}/sim/faults", json={"kind": "http_500", "count": 1}, timeout=5)
    assert ask(sim.url, "q").status_code == 500  # before validation: never reached generation
    assert log(sim.url)["per_sample"] == {}
    requests.post(f"{sim.url}/sim/faults", json={"kind": "bad_json", "count": 1}, timeout=5)
    ask(sim.url, "q")  # generated, then answered with a truncated body
    assert ask(sim.url, "q").ok
    assert log(sim.url)["per_sample"] == {key: {"received": 2, "generated": 2}}


def test_the_log_stays_bounded() -> None:
    small = RequestLog(keep=2, max_keys=2)
    for text in ("a", "b", "c", "a"):
        small.generated(text)
        small.received(text, RequestRecord.parse(b'{"rid": "%s"}' % text.encode()))
    doc = small.snapshot()
    assert doc["truncated"] is True and doc["samples"] == 2 and doc["generated"] == 3
    assert [r["rid"] for r in doc["recent"]] == ["c", "a"]


def test_one_log_serves_the_endpoint_and_the_recorded_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    with start_simulator(SimConfig(port=0, time_scale=0.0, record_requests=str(path))) as running:
        assert ask(running.url, "one", rid="a-1").ok
        assert ask(running.url, "bad", rid="b-1", top_p=7).status_code == 400  # in the file only
        requests.post(f"{running.url}/sim/stats/reset", timeout=5).raise_for_status()
        assert ask(running.url, "two", rid="c-1").ok
        doc = log(running.url)
    bodies = read_requests(path)  # every body, as sent, a reset notwithstanding
    assert [b["rid"] for b in bodies] == ["a-1", "b-1", "c-1"]
    assert bodies[0]["messages"] == [{"role": "user", "content": "one"}] and bodies[1]["top_p"] == 7
    two = sample_key([{"content": "two"}])
    assert doc["per_sample"] == {two: {"received": 1, "generated": 1}}
    assert doc["recent"] == [{"sample": two, **{k: v for k, v in bodies[2].items() if k != "messages"}}]


def test_a_record_keeps_any_body() -> None:
    assert RequestRecord.parse(b"not json") == RequestRecord({"raw": "not json"})
    assert RequestRecord.parse(b"[1, 2]").summary() == {"sample": None}
    record = RequestRecord.parse(b'{"rid": "r", "messages": [], "max_tokens": 5}')
    assert record.summary() == {"sample": None, "rid": "r", "max_tokens": 5}


@pytest.mark.parametrize(
    ("fields", "reasons"),
    [
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ({}, True),  # Qwen3's template: thinking unless enable_thinking is defined and false
        ({"chat_template_kwargs": {}}, True),
        ({"chat_template_kwargs": {"enable_thinking": None}}, True),  # defined, but not false
    ],
)
def test_reasoning_only_where_the_template_would_think(
    sim: RunningSimulator, fields: dict[str, Any], reasons: bool
) -> None:
    body = ask(sim.url, "What is 6*7?", **fields).json()
    message = body["choices"][0]["message"]
    assert bool(message["reasoning_content"]) is reasons
    assert bool(body["usage"]["reasoning_tokens"]) is reasons
    assert message["content"]
