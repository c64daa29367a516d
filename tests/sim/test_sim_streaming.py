"""The simulator streams as SGLang 0.5.23 does (``stream: true``), at its decode pace, frees the
slot of a client that went away, and loops on a share of its samples (``--loop-share``)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from dflash_tasks.core.repetition import RepetitionDetector, first_loop
from dflash_tasks.sim import RunningSimulator, start_simulator
from dflash_tasks.sim.__main__ import config_from_args
from dflash_tasks.sim.outbox import ClientStalled, Outbox
from dflash_tasks.sim.server import SimHandler
from dflash_tasks.sim.sse import ChunkHead, ReasoningStream, usage, usage_json
from dflash_tasks.sim.streaming import emission_points
from tests.helpers import wait_until

QUESTION = [{"role": "user", "content": "What is 6*7? Explain."}]


@pytest.fixture
def sims() -> Iterator[list[RunningSimulator]]:
    started: list[RunningSimulator] = []
    yield started
    for sim in started:
        sim.stop()


def start(sims: list[RunningSimulator], **config: Any) -> RunningSimulator:
    sim = start_simulator(**{"time_scale": 0.0, **config})
    sims.append(sim)
    return sim


def body(messages: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages or QUESTION, "max_tokens": 2000, **fields}


def events(resp: requests.Response) -> list[Any]:
    """The stream's events: the decoded JSON of each ``data:`` line, ``"[DONE]"`` as is."""
    out: list[Any] = []
    for line in resp.iter_lines():
        if not line:
            continue
        assert line.startswith(b"data: "), line
        data = line[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def stream(url: str, **fields: Any) -> list[Any]:
    resp = requests.post(f"{url}/v1/chat/completions", json=body(stream=True, **fields), timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    return events(resp)


def joined(chunks: list[Any], key: str) -> str:
    return "".join(
        c["choices"][0]["delta"].get(key) or "" for c in chunks if isinstance(c, dict) and c["choices"]
    )


def stats(sim: RunningSimulator) -> dict[str, Any]:
    result: dict[str, Any] = requests.get(f"{sim.url}/sim/stats", timeout=10).json()
    return result


# --- the wire format --------------------------------------------------------------------------------


def test_a_stream_carries_the_answer_the_plain_request_gets(sims: list[RunningSimulator]) -> None:
    sim = start(sims)
    plain = requests.post(f"{sim.url}/v1/chat/completions", json=body(), timeout=30).json()
    chunks = stream(sim.url, stream_options={"include_usage": True})
    first, *middle, finish, last, done = chunks
    assert done == "[DONE]"
    assert first["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert all(set(c) == {"id", "object", "created", "model", "choices"} for c in [first, *middle, finish])
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks[:-1])
    assert len({c["id"] for c in chunks[:-1]}) == 1
    for chunk in middle:
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "matched_stop"}
        assert choice["finish_reason"] is None and "role" not in choice["delta"]
        assert "reasoning_content" in choice["delta"]  # always there, null when absent
    message = plain["choices"][0]["message"]
    assert joined(middle, "reasoning_content") == message["reasoning_content"]
    assert joined(middle, "content") == message["content"]
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {"reasoning_content": None},
        "logprobs": None,
        "finish_reason": "stop",
        "matched_stop": 151645,
    }
    assert last["choices"] == [] and last["usage"] == plain["usage"]


def test_without_include_usage_there_is_no_usage_chunk(sims: list[RunningSimulator]) -> None:
    chunks = stream(start(sims).url)
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c for c in chunks[:-1])


def test_continuous_usage_counts_the_tokens_so_far(sims: list[RunningSimulator]) -> None:
    chunks = stream(start(sims).url, stream_options={"include_usage": True, "continuous_usage_stats": True})
    counted = [c["usage"]["completion_tokens"] for c in chunks[1:-3]]
    assert counted == sorted(counted) and counted[0] >= 1
    # the stop token has no text: a last decode step of it alone sends no text chunk
    final = chunks[-2]["usage"]["completion_tokens"]
    assert final - 1 <= counted[-1] <= final


def test_without_thinking_the_stream_is_answer_only(sims: list[RunningSimulator]) -> None:
    chunks = stream(start(sims).url, chat_template_kwargs={"enable_thinking": False})
    assert joined(chunks, "reasoning_content") == "" and joined(chunks, "content")


def test_a_cut_thought_ends_with_length(sims: list[RunningSimulator]) -> None:
    chunks = stream(start(sims).url, max_tokens=20, stream_options={"include_usage": True})
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-3]["choices"][0]["matched_stop"] is None
    assert chunks[-2]["usage"]["completion_tokens"] == 20 and joined(chunks, "content") == ""


def test_meta_info_is_refused_with_streaming_as_sglang_does(sims: list[RunningSimulator]) -> None:
    resp = requests.post(
        f"{start(sims).url}/v1/chat/completions", json=body(stream=True, return_meta_info=True), timeout=10
    )
    assert resp.status_code == 400
    assert resp.json()["message"] == (
        "return_meta_info is not supported with streaming. "
        "Please set stream=false when using return_meta_info=true."
    )


def test_the_stream_interval_sets_the_chunk_size(sims: list[RunningSimulator]) -> None:
    every_step = stream(start(sims).url)
    coarse = stream(start(sims, stream_interval=16).url)
    assert joined(every_step, "content") == joined(coarse, "content")
    assert len(coarse) * 3 < len(every_step)


def test_emission_points() -> None:
    assert emission_points(10, 1.0, 1) == list(range(1, 11))
    assert emission_points(10, 2.5, 1) == [2, 5, 7, 10]  # one chunk per verify pass
    assert emission_points(10, 1.0, 4) == [1, 5, 9, 10]  # the first at once, then every 4 unsent
    assert emission_points(0, 3.0, 1) == []


@pytest.mark.parametrize("text", ["plain", ' "quoted" \\ back', "tab\tnl\n\u0001", "é ü 中文 🙂", "", "<"])
@pytest.mark.parametrize("running", [None, (12, 40, 30), (12, 40, 0)])
def test_text_chunks_are_the_json_a_generic_encoder_writes(
    text: str, running: tuple[int, int, int] | None
) -> None:
    head = ChunkHead('id-"1"', 1700000000, "Qwen/Qwen3-8B")
    fields = usage(*running) if running else None
    fast = usage_json(*running) if running else b""
    assert head.reasoning(text, fast) == head.chunk({"reasoning_content": text}, usage=fields)
    assert head.content(text, fast) == head.chunk({"reasoning_content": None, "content": text}, usage=fields)


def test_the_reasoning_parser_holds_back_a_split_tag() -> None:
    parser = ReasoningStream(force_reasoning=True)
    out = [parser.feed(piece) for piece in ("<think>\nab", "c</th", "ink>\n\nThe", " answer")]
    assert out == [("\nab", ""), ("c", ""), ("", "\n\nThe"), ("", " answer")]


def test_chunks_arrive_at_the_decode_pace(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.05, tokens_per_second=40.0)  # 800 tokens a second
    arrivals: list[float] = []
    began = time.monotonic()
    resp = requests.post(
        f"{sim.url}/v1/chat/completions", json=body(stream=True, max_tokens=800), stream=True
    )
    for line in resp.iter_lines():
        if line:
            arrivals.append(time.monotonic() - began)
    assert arrivals[-1] >= 0.8  # 800 tokens cannot come sooner
    assert arrivals[1] < arrivals[-1] / 2  # the first text long before the last


# --- a client that goes away ---------------------------------------------------------------------------


def open_stream(sim: RunningSimulator, receive_buffer: int = 0, **fields: Any) -> socket.socket:
    """A raw streaming request whose connection the test closes itself (``receive_buffer``: the
    socket's, when set)."""
    payload = json.dumps(body(stream=True, **fields)).encode()
    conn = socket.socket()
    if receive_buffer:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    conn.connect((sim.host, sim.port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    conn.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return conn


def metric(sim: RunningSimulator, name: str) -> float:
    text = requests.get(f"{sim.url}/metrics", timeout=10).text
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"sglang:{name}{{")
    ]
    return sum(values)


def test_a_client_that_goes_away_frees_its_slot_at_once(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.25)  # 160 tokens a second
    conn = open_stream(sim, max_tokens=2000)
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    wait_until(lambda: metric(sim, "num_running_reqs") == 1, 10, "the stream running")
    closed = time.monotonic()
    conn.close()
    wait_until(lambda: metric(sim, "num_running_reqs") == 0, 10, "the slot freed", 0.02)
    assert time.monotonic() - closed < 1.0  # as the release does (0.15 s on its CPU engine)
    after = stats(sim)
    assert (after["aborted"], after["client_gone"], after["running"]) == (1, 1, 0)
    assert 0 < after["generation_tokens"] < 2000  # it stopped generating
    assert metric(sim, "num_aborted_requests_total") == 1
    assert metric(sim, "generation_tokens_total") == after["generation_tokens"]
    time.sleep(0.3)
    assert stats(sim)["generation_tokens"] == after["generation_tokens"]


def test_a_client_that_stops_reading_delays_no_other_stream_and_is_dropped(
    monkeypatch: pytest.MonkeyPatch, sims: list[RunningSimulator]
) -> None:
    """One stream's client reads nothing: its socket fills, the pump goes on sending the other
    streams, and once the client took nothing for the stall limit it is dropped as a client gone.
    Small socket buffers (the server's and the stuck client's) fill in a fraction of a second."""
    setup = SimHandler.setup

    def small_buffers(handler: SimHandler) -> None:
        handler.request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        setup(handler)

    monkeypatch.setattr(SimHandler, "setup", small_buffers)
    sim = start(sims, time_scale=0.01, mean_output_tokens=30000, stream_stall_seconds=0.5)  # 4000 tokens/s
    stuck = open_stream(sim, receive_buffer=4096, max_tokens=8000)
    try:
        wait_until(lambda: metric(sim, "num_running_reqs") == 1, 10, "the stuck stream running")
        time.sleep(0.3)  # its buffers fill
        began = time.monotonic()
        resp = requests.post(
            f"{sim.url}/v1/chat/completions", json=body(stream=True, max_tokens=300), timeout=5
        )
        assert events(resp)[-1] == "[DONE]"
        assert time.monotonic() - began < 1.5
        wait_until(lambda: metric(sim, "num_running_reqs") == 0, 10, "the stuck stream dropped", 0.02)
    finally:
        stuck.close()
    after = stats(sim)
    assert (after["aborted"], after["client_gone"], after["running"]) == (1, 1, 0)
    assert after["generation_tokens"] < 8000 + 300  # it stopped generating


def test_an_outbox_past_its_limit_is_a_stalled_client() -> None:
    here, there = socket.socketpair()
    out = Outbox(here, stall_seconds=60.0, limit=100_000)
    try:
        with pytest.raises(ClientStalled, match="bytes wait"):
            for _ in range(10_000):  # far more than the socket's buffers hold
                out.put(b"x" * 1000)
        with pytest.raises(ClientStalled):  # and it stays so
            out.flush()
    finally:
        here.close()
        there.close()


def test_one_pump_thread_sends_every_stream(sims: list[RunningSimulator]) -> None:
    """Concurrent streams are sent by the one pump thread (the handler threads only wait), each
    with its own answer."""
    sim = start(sims, time_scale=0.05, tokens_per_second=40.0)  # 800 tokens a second each
    questions = [[{"role": "user", "content": f"Question {n}: what is 6*7?"}] for n in range(16)]
    pumps: list[int] = []

    def count_pumps() -> None:
        while len(pumps) < 20:
            pumps.append(sum(t.name == "sim-stream-pump" for t in threading.enumerate()))
            time.sleep(0.01)

    watcher = threading.Thread(target=count_pumps)
    watcher.start()
    with ThreadPoolExecutor(16) as pool:
        streamed = list(pool.map(lambda q: stream(sim.url, messages=q, max_tokens=300), questions))
    watcher.join()
    assert max(pumps) == 1
    for question, chunks in zip(questions, streamed, strict=True):
        plain = requests.post(
            f"{sim.url}/v1/chat/completions", json=body(question, max_tokens=300), timeout=30
        )
        message = plain.json()["choices"][0]["message"]
        assert joined(chunks, "reasoning_content") == message["reasoning_content"]
        assert joined(chunks, "content") == message["content"]


def test_the_steps_due_at_once_go_in_one_write(sims: list[RunningSimulator]) -> None:
    """Without a pace every step is due at once: one HTTP chunk holds them all, and the tail."""
    sim = start(sims)
    conn = open_stream(sim, max_tokens=300)
    raw = b""
    while not raw.endswith(b"0\r\n\r\n"):
        piece = conn.recv(65536)
        assert piece, "the connection closed before the body's end"
        raw += piece
    conn.close()
    body_bytes = raw.split(b"\r\n\r\n", 1)[1]
    size_line, _, rest = body_bytes.partition(b"\r\n")
    assert rest[int(size_line, 16) :] == b"\r\n0\r\n\r\n"  # one chunk, then the end
    assert rest.count(b"data: ") > 10 and b"data: [DONE]" in rest


def test_stopping_the_simulator_ends_its_streams(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.5)  # 80 tokens a second
    conn = open_stream(sim, max_tokens=2000)
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    stopped = time.monotonic()
    sim.stop()
    conn.settimeout(5)
    while conn.recv(65536):
        pass
    assert time.monotonic() - stopped < 2.0
    conn.close()
    pumps = lambda: [t for t in threading.enumerate() if t.name == "sim-stream-pump"]  # noqa: E731
    wait_until(lambda: not pumps(), 5, "the pump thread ended")


def test_a_waiting_client_that_goes_away_leaves_the_queue(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.5, max_running_requests=1, disconnect_poll_seconds=0.1)
    running = open_stream(sim, max_tokens=2000)
    waiting = open_stream(sim, max_tokens=2000)
    wait_until(lambda: stats(sim)["waiting"] == 1, 10, "the second request queued")
    waiting.close()
    wait_until(lambda: stats(sim)["waiting"] == 0, 10, "the queued request dropped", 0.02)
    assert stats(sim)["client_gone"] == 1 and stats(sim)["running"] == 1
    running.close()


def test_a_full_queue_is_an_error_event(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.5, max_running_requests=1, max_queued_requests=0)
    holder = open_stream(sim, max_tokens=2000)
    wait_until(lambda: stats(sim)["running"] == 1, 10, "the slot taken")
    chunks = stream(sim.url)
    assert chunks == [
        {
            "error": {
                "object": "error",
                "message": "The request queue is full.",
                "type": "SERVICE_UNAVAILABLE",
                "param": None,
                "code": 503,
            }
        },
        "[DONE]",
    ]
    holder.close()


def test_the_metrics_split_streamed_requests(sims: list[RunningSimulator]) -> None:
    sim = start(sims)
    requests.post(f"{sim.url}/v1/chat/completions", json=body(), timeout=30)
    text = requests.get(f"{sim.url}/metrics", timeout=10).text
    assert 'is_streaming="true"' not in text
    stream(sim.url)
    text = requests.get(f"{sim.url}/metrics", timeout=10).text
    for name in ("num_requests_total", "prompt_tokens_total", "generation_tokens_total"):
        assert f"sglang:{name}{{" in text and any(
            line.startswith(f"sglang:{name}{{") and 'is_streaming="true"' in line
            for line in text.splitlines()
        )
    assert metric(sim, "num_requests_total") == 2


def test_streaming_through_the_throughput_curve(sims: list[RunningSimulator]) -> None:
    sim = start(sims, curve="kvbound", time_scale=0.01)
    chunks = stream(sim.url, stream_options={"include_usage": True})
    assert chunks[-2]["usage"]["completion_tokens"] > 0
    conn = open_stream(sim, max_tokens=2000)
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    conn.close()
    wait_until(
        lambda: metric(sim, "num_running_reqs") == 0 and metric(sim, "num_used_tokens") == 0, 10, "freed"
    )
    assert stats(sim)["aborted"] == 1


# --- loops ----------------------------------------------------------------------------------------------


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question {i}: what is {i} * 7?"}] for i in range(n)]


def test_a_share_of_the_samples_loops(sims: list[RunningSimulator]) -> None:
    sim = start(sims, loop_share=0.2)
    looped = 0
    for messages in prompts(200):
        reply = requests.post(
            f"{sim.url}/v1/chat/completions", json=body(messages, max_tokens=4096), timeout=30
        )
        doc = reply.json()
        if first_loop(doc["choices"][0]["message"]["reasoning_content"] or "") is not None:
            looped += 1  # a loop runs to the budget
            assert doc["choices"][0]["finish_reason"] == "length"
            assert doc["usage"]["completion_tokens"] == 4096
    assert 20 <= looped <= 60  # 20% of 200, binomial
    assert stats(sim)["looping"] == looped  # the detector saw every loop, and nothing else


def test_a_looping_stream_is_seen_by_the_detector_within_a_quarter_of_the_budget(
    sims: list[RunningSimulator],
) -> None:
    sim = start(sims, loop_share=1.0)
    budget = 4096
    options = {"include_usage": True, "continuous_usage_stats": True}
    for messages in prompts(20):
        chunks = stream(sim.url, messages=messages, max_tokens=budget, stream_options=options)
        assert chunks[-3]["choices"][0]["finish_reason"] == "length"
        detector, seen_at, before = RepetitionDetector(), 0, 0
        for chunk in chunks[1:-3]:
            so_far = chunk["usage"]["completion_tokens"]
            delta = chunk["choices"][0]["delta"].get("reasoning_content") or ""
            if detector.feed(delta, so_far - before) is not None:
                seen_at = so_far
                break
            before = so_far
        assert detector.loop is not None and 0 < seen_at <= 0.25 * budget, seen_at


def test_natural_sim_samples_never_fire_the_detector(sims: list[RunningSimulator]) -> None:
    sim = start(sims, loop_share=0.0, mean_output_tokens=3000)
    for messages in prompts(20):
        chunks = stream(sim.url, messages=messages, max_tokens=4096)
        detector = RepetitionDetector()
        for text in (joined(chunks, "reasoning_content"), joined(chunks, "content")):
            for at in range(0, len(text), 8):
                assert detector.feed(text[at : at + 8]) is None


def test_another_seed_may_escape_the_loop(sims: list[RunningSimulator]) -> None:
    sim = start(sims, loop_share=0.5)

    def loops(messages: list[dict[str, str]], seed: int) -> bool:
        reply = requests.post(f"{sim.url}/v1/chat/completions", json=body(messages, seed=seed), timeout=30)
        return bool(reply.json()["usage"]["completion_tokens"] == 2000)

    outcomes = {(i, seed): loops(m, seed) for i, m in enumerate(prompts(10)) for seed in (1, 2)}
    assert any(outcomes[i, 1] != outcomes[i, 2] for i in range(10))
    assert all(loops(m, 1) == outcomes[i, 1] for i, m in enumerate(prompts(10)))  # deterministic


def test_the_flags() -> None:
    config = config_from_args(
        [
            *("--loop-share", "0.2", "--stream-interval", "4"),
            *("--disconnect-poll-seconds", "1", "--stream-stall-seconds", "5"),
        ]
    )
    assert (config.loop_share, config.stream_interval, config.disconnect_poll_seconds) == (0.2, 4, 1.0)
    assert config.stream_stall_seconds == 5.0
    with pytest.raises(SystemExit):
        config_from_args(["--loop-share", "1.5"])
