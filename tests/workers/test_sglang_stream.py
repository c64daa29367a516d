"""The worker's streamed requests (loop detection on): the record they make is the plain one, a
looping thought is stopped early and its slot freed, and a stream's errors are retried as the
plain answer's. Over real HTTP, against the simulator (and, for wire-format edge cases the
simulator never sends, a small server of the test's own)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from dflash_tasks.core.errors import DflashError, RetryableError, SampleRejected
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.record import Turn
from dflash_tasks.core.repetition import CHARS_PER_TOKEN, FINISH_REASON, RepetitionSettings
from dflash_tasks.core.states import ErrorKind
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from dflash_tasks.sim.config import FaultSpec
from tests.helpers import wait_until
from workers.generation import Continuation, RetryPolicy, continue_turn, generate_turn
from workers.sglang_client import ChatRequest, Completion, SGLangClient, StreamReader

ON = RepetitionSettings()
#: A detector small enough for the test server's hand-made thoughts.
SMALL = RepetitionSettings(min_chars=100, min_repeats=2, max_period=50)
SPEC = GenerationSpec(model="m", max_tokens=2000)
#: Cut in its thought: ``length``.
CUT = dataclasses.replace(SPEC, max_tokens=60)
#: Room enough for a simulated loop to run long: a stopped one used a small share of it.
LONG = 4096
LONG_SPEC = dataclasses.replace(SPEC, max_tokens=LONG)
OPENER = "<think>\n"
QUESTION = [{"role": "user", "content": "What is 6*7? Explain."}]
POLICY = RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.002)
#: The per-request numbers a stream carries (its ``sglext`` chunk); the rest are the plain answer's only.
SPEC_KEYS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts")

#: A thought with no loop in it, and the span a looping one repeats after it.
NATURAL = "".join(f"step {i}: {i * i} and {i**3}; " for i in range(12))
SPAN = "abcdefghij"

#: The test server's events.
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
USAGE = b'"prompt_tokens":5,"completion_tokens":2'
TEXT = (
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"Hm."},"finish_reason":null}],'
    b'"usage":{%s}}\n\n' % USAGE
)
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def no_wait(_: float) -> None:
    """A retry's sleep, skipped."""


class RecordingClient(SGLangClient):
    """The real client, remembering every request body it sent."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, timeout=60.0)
        self.payloads: list[dict[str, Any]] = []

    def chat(self, request: ChatRequest) -> Completion:
        self.payloads.append(request.body())
        return super().chat(request)


@pytest.fixture
def sims() -> Iterator[list[RunningSimulator]]:
    started: list[RunningSimulator] = []
    yield started
    for sim in started:
        sim.stop()


def start(sims: list[RunningSimulator], **overrides: Any) -> RunningSimulator:
    sim = start_simulator(SimConfig(**{"port": 0, "time_scale": 0.0, "mean_output_tokens": 400, **overrides}))
    sims.append(sim)
    return sim


def stats(sim: RunningSimulator) -> dict[str, Any]:
    result: dict[str, Any] = requests.get(f"{sim.url}/sim/stats", timeout=10).json()
    return result


def turn(client: SGLangClient, rid: str, spec: GenerationSpec = SPEC, **kw: Any) -> Turn:
    messages = kw.pop("messages", QUESTION)
    return generate_turn(client, spec, messages, messages, POLICY, rid, no_wait, **kw)


def same_record(plain: Turn, streamed: Turn) -> None:
    """The streamed turn is the plain one: texts, finish, usage; ``meta_info`` its spec numbers."""
    assert streamed.status is plain.status and streamed.ok
    assert (streamed.reasoning, streamed.content) == (plain.reasoning, plain.content)
    assert streamed.finish_reason == plain.finish_reason and streamed.usage == plain.usage
    assert streamed.loop is None
    assert plain.meta_info is not None and streamed.meta_info is not None
    assert {k: streamed.meta_info[k] for k in SPEC_KEYS} == {k: plain.meta_info[k] for k in SPEC_KEYS}
    assert streamed.meta_info["cached_tokens"] is None  # the stream does not carry it


# --- the record --------------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [1, 8])
def test_a_streamed_turn_is_the_plain_turn(sims: list[RunningSimulator], interval: int) -> None:
    sim = start(sims, stream_interval=interval)
    client = RecordingClient(sim.url)
    history = [*QUESTION, {"role": "assistant", "content": "42."}, {"role": "user", "content": "Why?"}]
    cases = [
        (SPEC, QUESTION),
        (CUT, QUESTION),
        (dataclasses.replace(SPEC, thinking=False), QUESTION),
        (SPEC, history),
    ]
    for i, (spec, messages) in enumerate(cases):
        plain = turn(client, f"p{i}", spec, messages=messages)
        assert client.payloads[-1]["stream"] is False
        streamed = turn(client, f"s{i}", spec, messages=messages, repetition=ON)
        body = client.payloads[-1]
        assert body["stream"] is True and "return_meta_info" not in body
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        same_record(plain, streamed)
    assert [turn(client, "x", CUT).finish_reason] == ["length"]
    off = turn(client, "off", repetition=RepetitionSettings(enabled=False))
    assert client.payloads[-1]["stream"] is False and off.meta_info is not None


def test_a_continued_thought_streams_and_is_the_plain_continuation(sims: list[RunningSimulator]) -> None:
    sim = start(sims)
    client = RecordingClient(sim.url)
    cut = turn(client, "cut", CUT)
    assert cut.finish_reason == "length"
    how = Continuation(OPENER, SPEC.max_tokens)
    plain = continue_turn(client, SPEC, QUESTION, cut, how, POLICY, "pc", no_wait)
    streamed = continue_turn(client, SPEC, QUESTION, cut, how, POLICY, "sc", no_wait, repetition=ON)
    assert client.payloads[-1]["stream"] is True and client.payloads[-1]["continue_final_message"] is True
    assert (streamed.reasoning, streamed.content) == (plain.reasoning, plain.content)
    assert streamed.finish_reason == plain.finish_reason == "stop"
    assert streamed.usage == plain.usage and len(streamed.parts) == 2


def test_the_reader_reads_events_split_anywhere(sims: list[RunningSimulator]) -> None:
    sim = start(sims)
    body = ChatRequest(SPEC, QUESTION, "raw", watch=ON).body()
    raw = requests.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30).content
    whole = StreamReader(ON)
    whole.feed(raw)
    for size in (1, 7, 1000):  # a piece: a byte, a part of an event, several events
        pieces = StreamReader(ON)
        for at in range(0, len(raw), size):
            pieces.feed(raw[at : at + size])
        assert pieces.completion() == whole.completion()
    assert whole.completion().reasoning and whole.completion().content


# --- loops -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [1, 8])
def test_a_looping_thought_is_stopped_early_and_its_slot_freed(
    sims: list[RunningSimulator], interval: int
) -> None:
    sim = start(sims, loop_share=1.0, time_scale=0.05, stream_interval=interval)  # 800 tokens a second
    client = SGLangClient(sim.url)
    looped = turn(client, "loop", LONG_SPEC, repetition=ON)
    assert looped.ok and looped.finish_reason == FINISH_REASON and looped.loop is not None
    assert 0 < looped.usage.completion_tokens <= 0.25 * LONG
    loop = looped.loop
    assert loop.text == "reasoning" and loop.start_char < len(looped.reasoning)
    span = looped.reasoning[loop.start_char : loop.start_char + loop.period_chars]
    assert looped.reasoning[loop.start_char :].startswith(span * 2)
    assert looped.before_loop()[0] == looped.reasoning[: loop.start_char]
    wait_until(lambda: stats(sim)["running"] == 0, 10, "the slot freed", 0.02)
    after = stats(sim)
    assert (after["client_gone"], after["aborted"]) == (1, 1)
    assert after["generation_tokens"] < 0.3 * LONG  # it stopped generating soon after the stop


@pytest.mark.parametrize("cut_at", ["before", "inside"])
def test_a_continued_thought_that_loops_is_stopped_where_the_joined_thought_loops(
    sims: list[RunningSimulator], cut_at: str
) -> None:
    """Cut (plain, undetected) before its loop or 100 tokens into it, then continued with detection
    on: the loop is placed where the uncut thought's is, the cut text priming the detector."""
    sim = start(sims, loop_share=1.0)
    client = SGLangClient(sim.url)
    whole = turn(client, "whole", LONG_SPEC, repetition=ON).loop
    assert whole is not None
    cut_tokens = max(1, whole.start_token // 2) if cut_at == "before" else whole.start_token + 100
    cut = turn(client, "cut", dataclasses.replace(SPEC, max_tokens=cut_tokens))
    assert cut.finish_reason == "length" and cut.loop is None
    assert (len(cut.reasoning) > whole.start_char) is (cut_at == "inside")
    how = Continuation(OPENER, LONG)
    looped = continue_turn(client, SPEC, QUESTION, cut, how, POLICY, "c", no_wait, repetition=ON)
    loop = looped.loop
    assert loop is not None and looped.finish_reason == FINISH_REASON and len(looped.parts) == 2
    assert (loop.start_char, loop.period_chars) == (whole.start_char, whole.period_chars)
    assert abs(loop.start_token - whole.start_token) <= 3
    assert looped.before_loop()[0] == looped.reasoning[: whole.start_char]
    assert looped.usage.completion_tokens <= cut.usage.completion_tokens + 0.25 * LONG


def test_a_loop_completed_by_the_last_delta_is_recorded() -> None:
    """A stream that ends by itself (here: length) with a loop in its last few characters, fewer
    than a check's worth: the end of the stream checks them."""
    texts = [NATURAL, SPAN * 9, SPAN * 2]  # the loop reaches SMALL.min_chars at the end
    events = [ROLE] + [
        b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"%s"},"finish_reason":null}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % (text.encode(), 10 * (i + 1))
        for i, text in enumerate(texts)
    ]
    length = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    with Serving([*events, length, DONE]) as url:
        done = SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "end", watch=SMALL))
    assert done.finish_reason == FINISH_REASON and done.loop is not None
    assert done.loop.start_char == len(NATURAL) and done.loop.period_chars == len(SPAN)
    assert done.reasoning == "".join(texts).strip() and done.completion_tokens == 30


def thought_events(usage: bool) -> list[bytes]:
    """A thought that loops (:data:`SMALL`) three tokens a delta, with a continuous usage that
    leaves ``reasoning_tokens`` out (``usage``), or with none; it would go on after the loop."""
    texts = [NATURAL[at : at + 20] for at in range(0, len(NATURAL), 20)] + [SPAN] * 30
    return [ROLE] + [
        b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"%s"},"finish_reason":null}]%s}\n\n'
        % (
            text.encode(),
            b',"usage":{"prompt_tokens":5,"completion_tokens":%d}' % (3 * (i + 1)) if usage else b"",
        )
        for i, text in enumerate(texts)
    ]


def test_a_stopped_stream_counts_its_thoughts_tokens() -> None:
    """Stopped at its loop, a stream gets no final usage: its thought's tokens are those its deltas
    brought (here the usage never says)."""
    with Serving(thought_events(usage=True)) as url:
        done = SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "count", watch=SMALL))
    assert done.finish_reason == FINISH_REASON and done.loop is not None
    assert done.completion_tokens == done.reasoning_tokens == done.loop.detected_token > 0


def test_a_stream_without_usage_estimates_its_tokens() -> None:
    """A server that ignores ``stream_options``: the counts are estimated from the texts."""
    with Serving(thought_events(usage=False)) as url:
        done = SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "guess", watch=SMALL))
    assert done.finish_reason == FINISH_REASON and done.loop is not None
    assert done.completion_tokens == done.reasoning_tokens == done.loop.detected_token
    assert abs(done.completion_tokens - len(done.reasoning) / CHARS_PER_TOKEN) < 0.1 * len(done.reasoning)
    with Serving([ROLE, TEXT.replace(b',"usage":{%s}' % USAGE, b""), FINISH, DONE]) as url:
        whole = SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "whole", watch=ON))
    assert (whole.reasoning, whole.finish_reason, whole.completion_tokens, whole.reasoning_tokens) == (
        "Hm.",
        "stop",
        1,
        1,
    )


def test_without_detection_the_loop_runs_to_max_tokens(sims: list[RunningSimulator]) -> None:
    sim = start(sims, loop_share=1.0)
    looped = turn(SGLangClient(sim.url), "loop", LONG_SPEC)
    assert looped.finish_reason == "length" and looped.loop is None
    assert looped.usage.completion_tokens == LONG


# --- errors ------------------------------------------------------------------------------------------


def test_a_full_queue_event_is_retried(sims: list[RunningSimulator]) -> None:
    sim = start(sims, time_scale=0.5, max_running_requests=1, max_queued_requests=0)
    holder = hold_slot(sim)
    wait_until(lambda: stats(sim)["running"] == 1, 10, "the slot taken")
    client = SGLangClient(sim.url)
    with pytest.raises(RetryableError) as caught:
        client.chat(ChatRequest(SPEC, QUESTION, "full", watch=ON))
    assert caught.value.kind is ErrorKind.HTTP_503 and "queue is full" in str(caught.value)

    def release(_: float) -> None:
        holder.close()
        wait_until(lambda: stats(sim)["running"] == 0, 10, "the slot freed")

    answered = generate_turn(client, SPEC, QUESTION, QUESTION, POLICY, "retry", release, repetition=ON)
    assert answered.ok and answered.attempts == 2 and answered.finish_reason == "stop"


@pytest.mark.parametrize("kind", ["bad_json", "abort"])
def test_a_stream_cut_or_aborted_midway_is_retried(sims: list[RunningSimulator], kind: str) -> None:
    sim = start(sims, faults=(FaultSpec(kind, count=1),))
    client = SGLangClient(sim.url)
    with pytest.raises(RetryableError) as caught:
        client.chat(ChatRequest(SPEC, QUESTION, "cut", watch=ON))
    assert caught.value.kind in ((ErrorKind.ABORT,) if kind == "abort" else (ErrorKind.CONNECTION,))
    again = turn(client, "again", repetition=ON)
    assert again.ok and again.attempts == 1 and again.finish_reason == "stop"


def usage_text(usage: bytes) -> bytes:
    """A text event like :data:`TEXT` whose usage is ``{usage}``."""
    return TEXT.replace(USAGE, usage)


@pytest.mark.parametrize(
    ("events", "raised", "kind"),
    [
        ([ROLE, TEXT, FINISH], RetryableError, ErrorKind.BAD_RESPONSE),  # no [DONE]
        ([ROLE, TEXT, DONE], RetryableError, ErrorKind.BAD_RESPONSE),  # no finish
        ([ROLE, b'data: {"choices":[{"delta":\n\n', DONE], RetryableError, ErrorKind.BAD_RESPONSE),
        ([b'data: {"error": {"message": "bad", "code": 400}}\n\n', DONE], SampleRejected, ErrorKind.REJECTED),
        (
            [b'data: {"error": {"message": "down", "code": 500}}\n\n', DONE],
            RetryableError,
            ErrorKind.HTTP_5XX,
        ),
        ([b'data: {"error": "odd"}\n\n', DONE], RetryableError, ErrorKind.OTHER),
        ([ROLE, TEXT[:-2] + b" {}\n\n", FINISH, DONE], RetryableError, ErrorKind.BAD_RESPONSE),
        ([ROLE, b"data: \n\n", DONE], RetryableError, ErrorKind.BAD_RESPONSE),
        # a delta whose text is not a string
        (
            [ROLE, b'data: {"choices":[{"delta":{"reasoning_content":["x"]}}]}\n\n', FINISH, DONE],
            RetryableError,
            ErrorKind.BAD_RESPONSE,
        ),
        # a malformed usage: retried as a malformed plain answer is
        (
            [ROLE, usage_text(b'"prompt_tokens":"x","completion_tokens":2'), FINISH, DONE],
            RetryableError,
            ErrorKind.BAD_RESPONSE,
        ),
        (
            [ROLE, usage_text(b'"completion_tokens":Infinity'), FINISH, DONE],
            RetryableError,
            ErrorKind.BAD_RESPONSE,
        ),
        (
            [ROLE, usage_text(b'"completion_tokens":2,"reasoning_tokens":1e999'), FINISH, DONE],
            RetryableError,
            ErrorKind.BAD_RESPONSE,
        ),
        (
            [ROLE, usage_text(b'"completion_tokens":2,"completion_tokens_details":[1]'), FINISH, DONE],
            RetryableError,
            ErrorKind.BAD_RESPONSE,
        ),
    ],
)
def test_a_malformed_or_unfinished_stream_raises(
    events: list[bytes], raised: type[DflashError], kind: ErrorKind
) -> None:
    with Serving(events) as url, pytest.raises(raised) as caught:
        SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "odd", watch=ON))
    assert type(caught.value) is raised and caught.value.kind is kind


@pytest.mark.parametrize("event", [b'"error"', b'["error"]', b"7"])
def test_an_event_that_is_not_an_object_is_malformed(event: bytes) -> None:
    with (
        Serving([ROLE, b"data: %s\n\n" % event, FINISH, DONE]) as url,
        pytest.raises(RetryableError) as caught,
    ):
        SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "odd", watch=ON))
    assert caught.value.kind is ErrorKind.BAD_RESPONSE and str(caught.value).endswith(": not a JSON object")


def test_a_stream_silent_past_the_timeout_is_a_timeout() -> None:
    """The read timeout bounds the silence between two pieces; past it, a retryable timeout."""
    with Serving([ROLE, TEXT], stall=True) as url, pytest.raises(RetryableError) as caught:
        SGLangClient(url, timeout=0.5).chat(ChatRequest(SPEC, QUESTION, "slow", watch=ON))
    assert caught.value.kind is ErrorKind.TIMEOUT and "timed out after" in str(caught.value)


def test_a_whole_stream_from_the_tests_server_reads() -> None:
    with Serving([ROLE, TEXT, FINISH, DONE]) as url:
        done = SGLangClient(url).chat(ChatRequest(SPEC, QUESTION, "ok", watch=ON))
    assert (done.reasoning, done.finish_reason, done.completion_tokens, done.prompt_tokens) == (
        "Hm.",
        "stop",
        2,
        5,
    )


class Serving:
    """A server that answers every chat with ``events`` as one chunked ``text/event-stream`` body."""

    def __init__(self, events: list[bytes], stall: bool = False) -> None:
        body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
        end = b"0\r\n\r\n"
        self.released = released = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(body)
                if stall:  # silent until the test is done
                    self.wfile.flush()
                    released.wait(60)
                self.wfile.write(end)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def hold_slot(sim: RunningSimulator) -> socket.socket:
    """A long streamed request on a socket the test closes itself."""
    payload = json.dumps({"model": "m", "messages": QUESTION, "max_tokens": 2000, "stream": True}).encode()
    conn = socket.create_connection((sim.host, sim.port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    conn.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return conn
