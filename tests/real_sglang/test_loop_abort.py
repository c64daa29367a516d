"""A looping thought on the real server: seen by the repetition detector, stopped by closing the
stream, aborted by the server, its slot freed and its generation stopped within a few seconds.
Held against the release serving the looping tiny checkpoint and against the simulator with
``--loop-share 1``, with the same assertions. (The release aborts at once: the closed connection
cancels the response's generator, and ``TokenizerManager.generate_request`` aborts a dispatched
request on any exception; ``create_abort_task``'s abort 2 s later is only a backstop.)

Twice: a plain HTTP client (``http.client``) feeding the detector itself, and the worker's own
client (``SGLangClient.chat`` with loop detection on), whose turn comes back as ``repetition``.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.repetition import FINISH_REASON, RepetitionDetector, RepetitionSettings
from tests.real_sglang.conftest import SETUP_TIMEOUT, Target
from tests.real_sglang.test_streaming import QUESTION, payload
from workers.sglang_client import ChatRequest, SGLangClient

pytestmark = pytest.mark.timeout(SETUP_TIMEOUT)


def metrics(target: Target) -> dict[str, float]:
    """The ``sglang:*`` samples, summed over their label sets."""
    out: dict[str, float] = {}
    for line in requests.get(f"{target.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:"):
            name = line.split("{", 1)[0].split(" ", 1)[0][len("sglang:") :]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def sse_lines(resp: http.client.HTTPResponse) -> Iterator[Any]:
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[len(b"data: ") :])


def test_a_loop_is_seen_and_closing_the_stream_frees_the_server(looping_target: Target) -> None:
    target = looping_target
    budget = target.context_length - 64
    before = metrics(target)
    body = payload(
        target,
        stream=True,
        max_completion_tokens=budget,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    url = urlsplit(target.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=120)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {target.api_key}"}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    assert resp.status == 200
    detector, seen_at, so_far = RepetitionDetector(), 0, 0
    for chunk in sse_lines(resp):
        if not chunk["choices"] or "usage" not in chunk:
            continue
        tokens, so_far = chunk["usage"]["completion_tokens"] - so_far, chunk["usage"]["completion_tokens"]
        if detector.feed(chunk["choices"][0]["delta"].get("reasoning_content") or "", tokens) is not None:
            seen_at = so_far
            break
    assert detector.loop is not None, "the stream ended without a loop"
    assert metrics(target)["num_running_reqs"] == 1
    resp.close()
    conn.close()
    freed, generated = assert_stopped_and_freed(target, before, time.monotonic(), seen_at, budget)
    print(
        f"\n[{target.kind}] loop seen at {seen_at} of {budget} tokens (period "
        f"{detector.loop.period_chars} chars, from token {detector.loop.start_token}); slot freed "
        f"{freed:.2f} s after the close; {generated:.0f} tokens generated in all"
    )
    assert seen_at <= 0.25 * budget


def test_the_workers_client_stops_the_loop_and_the_server_frees_it(looping_target: Target) -> None:
    target = looping_target
    budget = target.context_length - 64
    before = metrics(target)
    client = SGLangClient(target.url, timeout=120, api_key=target.api_key)
    spec = GenerationSpec(model=target.served_name, max_tokens=budget)
    started = time.monotonic()
    done = client.chat(ChatRequest(spec, QUESTION, "worker-loop", watch=RepetitionSettings()))
    returned = time.monotonic()
    assert done.finish_reason == FINISH_REASON and done.loop is not None
    assert done.loop.text == "reasoning" and 0 < done.completion_tokens <= 0.25 * budget
    freed, generated = assert_stopped_and_freed(target, before, returned, done.completion_tokens, budget)
    print(
        f"\n[{target.kind}] worker's client: loop seen at {done.completion_tokens} of {budget} tokens "
        f"after {returned - started:.2f} s (period {done.loop.period_chars} chars, from token "
        f"{done.loop.start_token}); slot freed {freed:.2f} s after chat() returned; "
        f"{generated:.0f} tokens generated in all"
    )


def assert_stopped_and_freed(
    target: Target, before: dict[str, float], closed: float, stopped_at: int, budget: int
) -> tuple[float, float]:
    """After a stream closed at ``closed`` (monotonic) with ``stopped_at`` tokens read: the slot is
    freed within 5 s, counted as one abort, and generation stops short of ``budget`` and stays
    stopped. Returns (seconds to free the slot, tokens generated since ``before``)."""
    wait_for(target, lambda m: m["num_running_reqs"] == 0, 30)
    freed = time.monotonic() - closed
    settled = metrics(target)
    time.sleep(2.0)
    later = metrics(target)
    generated = settled["generation_tokens_total"] - before.get("generation_tokens_total", 0.0)
    assert freed < 5.0, f"still running {freed:.1f} s after the client closed its stream"
    assert settled["num_aborted_requests_total"] - before.get("num_aborted_requests_total", 0.0) == 1
    assert stopped_at <= generated < budget  # stopped, not run to max_tokens
    assert later["generation_tokens_total"] == settled["generation_tokens_total"]  # generation stopped
    assert later["num_running_reqs"] == 0
    return freed, generated


def test_a_waiting_stream_whose_client_goes_away_leaves_the_queue(looping_target: Target) -> None:
    """A stream still waiting for a slot has sent nothing yet: the server looks at its connection
    every 4 s (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``) and aborts it once it is closed."""
    target = looping_target
    before = metrics(target)
    running, waiting = (raw_stream(target) for _ in range(2))
    try:
        wait_for(target, lambda m: m["num_running_reqs"] == 1 and m["num_queue_reqs"] == 1, 60)
        waiting.close()
        closed = time.monotonic()
        wait_for(target, lambda m: m["num_queue_reqs"] == 0, 30)
        left = time.monotonic() - closed
        print(f"\n[{target.kind}] the waiting request left the queue {left:.2f} s after its client closed")
        assert left < 6.0
        assert metrics(target)["num_running_reqs"] == 1  # the running one goes on
    finally:
        running.close()
    wait_for(target, lambda m: m["num_running_reqs"] == 0, 30)
    aborted = metrics(target)["num_aborted_requests_total"] - before.get("num_aborted_requests_total", 0.0)
    assert aborted == 2


def raw_stream(target: Target) -> socket.socket:
    """A looping streamed request on a socket the test closes itself (it reads nothing)."""
    body = json.dumps(payload(target, stream=True, max_completion_tokens=target.context_length - 64))
    url = urlsplit(target.url)
    conn = socket.create_connection((url.hostname or "", url.port or 80))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {target.api_key}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    conn.sendall(head.encode() + body.encode())
    return conn


def wait_for(target: Target, done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done(metrics(target)):
        assert time.monotonic() < deadline, metrics(target)
        time.sleep(0.1)
