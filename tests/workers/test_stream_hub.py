"""The stream hub: one thread of the process reads every streamed answer; the caller gets the same
record, the connection goes back to its pool when the body was read to its end, bodies it cannot
take are read the usual way, and a forked child gets a hub of its own. Over real HTTP, against the
simulator and small servers of the test's own."""

from __future__ import annotations

import multiprocessing
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dflash_tasks.core.errors import RetryableError
from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.repetition import RepetitionSettings
from dflash_tasks.core.states import ErrorKind
from dflash_tasks.sim import RunningSimulator, SimConfig, start_simulator
from tests.helpers import wait_until
from workers.sglang_client import ChatRequest, Completion, SGLangClient, stream_hub
from workers.sglang_client.stream import StreamReader

ON = RepetitionSettings()
SPEC = GenerationSpec(model="m", max_tokens=600)
EVENTS = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"Hm."},"finish_reason":null}],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
)


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_simulator(SimConfig(port=0, time_scale=0.0, mean_output_tokens=300, stream_interval=4)) as s:
        yield s


def ask(
    client: SGLangClient, rid: str, watch: RepetitionSettings | None = ON, question: int = 0
) -> Completion:
    messages = [{"role": "user", "content": f"Question {question}: what is 6*7? Explain."}]
    return client.chat(ChatRequest(SPEC, messages, rid, watch=watch))


class Counting:
    """A server answering every chat with :data:`EVENTS`, chunked (``chunked=False``: one sized
    body) and counting the connections it accepted."""

    def __init__(self, chunked: bool = True) -> None:
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                outer.connections += 1

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for event in EVENTS:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    body = b"".join(EVENTS)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ThreadNoting(StreamReader):
    """A reader that notes the threads it was fed on."""

    threads: set[str] = set()

    def feed(self, data: bytes) -> bool:
        ThreadNoting.threads.add(threading.current_thread().name)
        return super().feed(data)


def test_the_hub_thread_reads_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """What arrived with the headers is read by the caller, the rest by the hub's thread."""
    monkeypatch.setattr("workers.sglang_client.client.StreamReader", ThreadNoting)
    ThreadNoting.threads = set()
    paced = SimConfig(port=0, time_scale=0.05, mean_output_tokens=300, stream_interval=4)
    with start_simulator(paced) as sim:
        streamed = ask(SGLangClient(sim.url), "hub")
        plain = ask(SGLangClient(sim.url), "hub", watch=None)
    assert "sglang-streams" in ThreadNoting.threads
    assert (streamed.reasoning, streamed.content, streamed.completion_tokens) == (
        plain.reasoning,
        plain.content,
        plain.completion_tokens,
    )


def test_a_stream_read_to_its_end_leaves_its_connection_for_the_next_request() -> None:
    server = Counting()
    try:
        client = SGLangClient(server.url)
        for n in range(3):
            done = ask(client, f"r{n}")
            assert (done.reasoning, done.finish_reason) == ("Hm.", "stop")
        assert server.connections == 1
    finally:
        server.close()


def test_a_body_the_hub_cannot_take_is_read_the_usual_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workers.sglang_client.client.StreamReader", ThreadNoting)
    ThreadNoting.threads = set()
    server = Counting(chunked=False)
    try:
        done = ask(SGLangClient(server.url), "sized")
    finally:
        server.close()
    assert (done.reasoning, done.completion_tokens) == ("Hm.", 2)
    assert ThreadNoting.threads == {threading.current_thread().name}


def test_many_streams_at_once_each_get_their_own_answer(sim: RunningSimulator) -> None:
    client = SGLangClient(sim.url)
    with ThreadPoolExecutor(48) as pool:
        streamed = list(pool.map(lambda n: ask(client, f"s{n}", question=n % 12), range(96)))
    plain = {n: ask(client, f"p{n}", watch=None, question=n) for n in range(12)}
    assert len({p.reasoning for p in plain.values()}) == 12
    for n, done in enumerate(streamed):
        assert (done.reasoning, done.content) == (plain[n % 12].reasoning, plain[n % 12].content)


def test_a_reader_that_fails_fails_its_request_only(
    monkeypatch: pytest.MonkeyPatch, sim: RunningSimulator
) -> None:
    class Broken(StreamReader):
        def feed(self, data: bytes) -> bool:
            raise KeyError("odd")

    client = SGLangClient(sim.url)
    monkeypatch.setattr("workers.sglang_client.client.StreamReader", Broken)
    with pytest.raises(RetryableError, match="reading the stream failed: KeyError"):
        ask(client, "broken")
    monkeypatch.undo()
    assert ask(client, "after").finish_reason in ("stop", "length")


def _child(url: str, out: Any) -> None:
    done = ask(SGLangClient(url), "child")
    out.send((done.finish_reason, stream_hub.shared_hub()._thread.is_alive()))


def test_a_forked_child_reads_its_streams_with_a_hub_of_its_own(sim: RunningSimulator) -> None:
    ask(SGLangClient(sim.url), "parent")  # the parent's hub runs
    parent_hub = stream_hub.shared_hub()
    here, there = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=_child, args=(sim.url, there))
    child.start()
    try:
        assert here.poll(30), "the child's streamed request never ended"
        finish, alive = here.recv()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert finish in ("stop", "length") and alive
    assert stream_hub.shared_hub() is parent_hub


def read_request(conn: socket.socket) -> None:
    """Read one whole request (its headers, then its Content-Length of body): closing a socket with
    unread bytes sends a reset, not the end of the stream the test means."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)


def test_the_hub_gives_no_connection_back_when_the_server_cuts_the_body() -> None:
    """A body cut mid-chunk: retryable, as a cut connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        read_request(conn)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        conn.sendall(head + b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]) + b"40\r\ndata: {")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(RetryableError, match="closed the stream before its end"):
            ask(SGLangClient(f"http://127.0.0.1:{port}"), "cut")
    finally:
        thread.join(5)
        listener.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class HeadersFirst:
    """A server that sends the answer's headers, waits until the client built its reader (the hub
    takes the socket over right after), then runs ``then`` on the connection."""

    def __init__(self, then: Any) -> None:
        self.reader_built = threading.Event()
        self.then_done = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, args=(then,), daemon=True)
        self._thread.start()

    def _serve(self, then: Any) -> None:
        conn, _ = self._listener.accept()
        read_request(conn)
        conn.sendall(HEAD)
        self.reader_built.wait(10)
        then(conn)
        self.then_done.set()

    def close(self) -> None:
        self._thread.join(5)
        self._listener.close()


def test_a_connection_reset_before_the_take_over_is_a_retryable_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reset after the headers: the take-over's first read of the body fails."""

    def reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    server = HeadersFirst(reset)

    class Waiting(StreamReader):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            server.reader_built.set()
            server.then_done.wait(10)
            time.sleep(0.05)  # the reset has reached the client's socket

    monkeypatch.setattr("workers.sglang_client.client.StreamReader", Waiting)
    try:
        with pytest.raises(RetryableError, match="connection error") as caught:
            ask(SGLangClient(server.url), "reset")
    finally:
        server.close()
    assert caught.value.kind is ErrorKind.CONNECTION


def test_a_body_with_nothing_buffered_at_the_take_over_is_read_by_the_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing waits when the hub takes the socket over (a non-blocking read finds nothing)."""

    def body_later(conn: socket.socket) -> None:
        time.sleep(0.05)
        conn.sendall(b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n")
        conn.recv(1)  # until the client closes

    server = HeadersFirst(body_later)

    class Noting(StreamReader):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            server.reader_built.set()

    monkeypatch.setattr("workers.sglang_client.client.StreamReader", Noting)
    client = SGLangClient(server.url)
    try:
        done = ask(client, "later")
        client._session().close()
    finally:
        server.close()
    assert (done.reasoning, done.finish_reason) == ("Hm.", "stop")


class Interrupted(Exception):
    """What a signal handler raises in the caller (as Celery's soft time limit does)."""


@pytest.mark.parametrize("lets_go", [True, False], ids=["handed-back", "closed-under-the-hub"])
def test_a_caller_that_leaves_mid_stream_leaves_the_hub_serving(
    monkeypatch: pytest.MonkeyPatch, sim: RunningSimulator, lets_go: bool
) -> None:
    """Interrupted while the hub reads its stream, the caller closes its socket (``lets_go``:
    once the hub let it go; else under the hub, as after a second interrupt); the next
    connections (the closed one's descriptor number again) are read as usual by the same hub."""
    if not lets_go:
        monkeypatch.setattr(stream_hub.StreamHub, "_leave", lambda self, answer: None, raising=False)
    hub = stream_hub.StreamHub()
    monkeypatch.setattr(stream_hub, "_shared", hub)

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    slow = SimConfig(port=0, time_scale=0.25, mean_output_tokens=300, stream_interval=4)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with start_simulator(slow) as paced:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                ask(SGLangClient(paced.url), "left")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    client = SGLangClient(sim.url)
    for n in range(3):
        assert ask(client, f"after{n}").finish_reason in ("stop", "length")
        client._session().close()  # a new connection each time
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda n: ask(client, f"many{n}", question=n), range(16)))
    assert all(d.finish_reason in ("stop", "length") for d in done)
    assert stream_hub.shared_hub() is hub and hub._thread.is_alive()
    wait_until(lambda: not hub._answers, 2, "the hub to let go of every socket")


def _child_hub(out: Any) -> None:
    out.send(stream_hub.shared_hub()._thread.is_alive())


def test_a_child_forked_while_another_thread_held_the_hub_lock_gets_its_hub() -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with stream_hub._shared_lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(5)
    fork = multiprocessing.get_context("fork")
    here, there = fork.Pipe()
    child = fork.Process(target=_child_hub, args=(there,))
    try:
        child.start()
        assert here.poll(10), "the child's shared_hub() never returned (deadlocked)"
        assert here.recv()
    finally:
        release.set()
        holder.join(5)
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join(5)


def test_a_hub_that_failed_closes_its_selector_and_wake_sockets() -> None:
    hub = stream_hub.StreamHub()

    def broken() -> None:
        raise RuntimeError("odd")

    hub._adopt = broken  # type: ignore[method-assign]
    hub._wake()
    hub._thread.join(5)
    assert isinstance(hub._failed, RuntimeError)
    assert hub._wake_r.fileno() == -1 and hub._wake_w.fileno() == -1
    assert hub._selector.get_map() is None  # closed
    hub._wake()  # a late caller's wake-up is no error
