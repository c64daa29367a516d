"""A worker learns its server's model (real HTTP), refuses other models' chunks, and moves its
consumption to the queues of the model its server serves."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dflash_tasks.core.errors import RetryableError, ServerUnavailable, WrongModel
from dflash_tasks.sim import SimConfig, start_simulator
from workers.flow.consumer_switch import ConsumerSwitch
from workers.identity import ServerIdentity, ServerModel, fetch_identity

# --- reading the identity ---------------------------------------------------------------------


def test_identity_from_the_simulator() -> None:
    config = SimConfig(port=0, model="/dev/shm/models/Qwen3.6-27B", served_model_name="qwen-27b")
    with start_simulator(config) as sim:
        identity = fetch_identity(sim.url)
    assert identity == ServerIdentity("/dev/shm/models/Qwen3.6-27B", "qwen-27b", "0.5.23")


class OldServer:
    """A stand-in for a release without ``/model_info`` (only the ``/get_*`` names), optionally with
    an API key; it records the paths and Authorization headers it saw."""

    def __init__(self, api_key: str = "") -> None:
        self.seen: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                outer.seen.append((self.path, auth))
                bodies: dict[str, Any] = {
                    "/get_model_info": {"model_path": "Qwen/Qwen3-8B"},  # no served_model_name
                    "/get_server_info": {"version": "0.4.9"},
                }
                if api_key and auth != f"Bearer {api_key}":
                    self._reply(401, {"error": "Unauthorized"})
                elif self.path in bodies:
                    self._reply(200, bodies[self.path])
                else:
                    self._reply(404, {"detail": "Not Found"})

            def _reply(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def old_server() -> Iterator[Callable[..., OldServer]]:
    made: list[OldServer] = []

    def make(api_key: str = "") -> OldServer:
        made.append(OldServer(api_key))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_old_releases_fall_back_to_the_get_endpoints_and_every_call_carries_the_key(
    old_server: Callable[..., OldServer],
) -> None:
    server = old_server(api_key="s3cret")
    identity = fetch_identity(server.url, api_key="s3cret")
    assert identity == ServerIdentity("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "0.4.9")  # served name defaults
    assert [p for p, _ in server.seen] == [
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
    ]
    assert {auth for _, auth in server.seen} == {"Bearer s3cret"}


def test_a_missing_api_key_is_named(old_server: Callable[..., OldServer]) -> None:
    server = old_server(api_key="s3cret")
    with pytest.raises(RetryableError, match=r"HTTP 401.*DFLASH_SGLANG_API_KEY"):
        fetch_identity(server.url)


def test_an_unreachable_server_is_retryable() -> None:
    with start_simulator(SimConfig(port=0)) as sim:
        url = sim.url
    with pytest.raises(RetryableError, match="cannot reach"):
        fetch_identity(url, timeout=1.0)


# --- the guard ----------------------------------------------------------------------------------

A = ServerIdentity("/dev/shm/models/Model-A", "/dev/shm/models/Model-A", "0.5.23")
B = ServerIdentity("Org/Model-B", "Org/Model-B", "0.5.23")


class Readings:
    """The server's answers, in turn; an exception instance is raised instead."""

    def __init__(self, *answers: ServerIdentity | Exception) -> None:
        self.answers = list(answers)

    def __call__(self) -> ServerIdentity:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_check_refuses_other_models_and_an_unknown_model() -> None:
    changes: list[tuple[ServerIdentity | None, ServerIdentity]] = []
    server = ServerModel(Readings(A), on_change=lambda old, new: changes.append((old, new)))
    with pytest.raises(ServerUnavailable, match="not known yet"):
        server.check("Model-A")
    server.refresh()
    server.check("Model-A")
    server.check("someorg/model-a")
    with pytest.raises(WrongModel, match=r"'Org/Model-B'.*Model-A"):
        server.check("Org/Model-B")
    server.refresh()  # the same answer: no change reported
    assert changes == [(None, A)]


def test_confirm_reads_again_and_sees_a_server_restarted_with_another_model() -> None:
    changes: list[tuple[ServerIdentity | None, ServerIdentity]] = []
    server = ServerModel(Readings(A, B), on_change=lambda old, new: changes.append((old, new)))
    server.refresh()
    with pytest.raises(WrongModel):
        server.confirm("Model-A")  # the chunk started on A; the server now serves B
    assert changes == [(None, A), (A, B)] and server.current == B


def test_confirm_keeps_the_last_reading_when_the_server_does_not_answer() -> None:
    server = ServerModel(Readings(A, RetryableError("connection refused")))
    server.refresh()
    server.confirm("Model-A")
    assert server.try_refresh() is None and server.current == A


# --- the consumer switch follows the model -------------------------------------------------------


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.calls.append((fn.__name__, args))

    def add_task_queue(self, *args: Any) -> None: ...

    def cancel_task_queue(self, *args: Any) -> None: ...


def test_switch_moves_to_the_new_model_queues() -> None:
    switch = ConsumerSwitch(["dflash"])
    switch.set_queues(["dflash.model-a", "dflash"])  # the model became known before the start
    assert switch.starting() == ["dflash.model-a", "dflash"]
    consumer = FakeConsumer()
    switch.attach(consumer)
    assert consumer.calls == []  # it starts with exactly those
    switch.set_queues(["dflash.model-b", "dflash"])  # the server restarted with another model
    assert consumer.calls == [
        ("add_task_queue", ("dflash.model-b", None, "direct", None)),
        ("cancel_task_queue", ("dflash.model-a",)),
    ]
    consumer.calls.clear()
    switch.pause()
    assert sorted(consumer.calls) == [
        ("cancel_task_queue", ("dflash",)),
        ("cancel_task_queue", ("dflash.model-b",)),
    ]
    consumer.calls.clear()
    switch.set_queues(["dflash.model-c", "dflash"])  # while paused: nothing until resumed
    assert consumer.calls == []
    switch.resume()
    assert consumer.calls == [
        ("add_task_queue", ("dflash.model-c", None, "direct", None)),
        ("add_task_queue", ("dflash", None, "direct", None)),
    ]


def test_switch_attached_after_the_model_changed_catches_up() -> None:
    switch = ConsumerSwitch(["dflash"])
    assert switch.starting() == ["dflash"]  # started before the server answered
    switch.set_queues(["dflash.model-a", "dflash"])
    consumer = FakeConsumer()
    switch.attach(consumer)
    assert consumer.calls == [("add_task_queue", ("dflash.model-a", None, "direct", None))]
