"""A worker learns its server's model (real HTTP), refuses other models' chunks, and moves its
consumption to the queues of the model its server serves."""

from __future__ import annotations

import pytest

from dflash_tasks.core.errors import RetryableError, ServerUnavailable, WrongModel
from dflash_tasks.sim import SimConfig, start_simulator
from tests.workers.test_worker_control import FakeConsumer
from workers.flow.consumer_switch import ConsumerSwitch
from workers.generate.identity import ServerModel
from workers.sglang_client import ServerIdentity, SGLangClient

# --- reading the identity ---------------------------------------------------------------------


def test_identity_from_the_simulator() -> None:
    config = SimConfig(port=0, model="/dev/shm/models/Qwen3.6-27B", served_model_name="qwen-27b")
    with start_simulator(config) as sim:
        identity = SGLangClient(sim.url).identity()
    assert identity == ServerIdentity("/dev/shm/models/Qwen3.6-27B", "qwen-27b", "0.5.23")


# Old releases (/get_* only) and the API key on these calls: tests/workers/test_sglang_client.py.


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


def test_confirm_with_a_quick_reading_reads_everything_only_when_the_model_changed() -> None:
    full = Readings(A, B)
    calls: list[str] = []

    def fetch() -> ServerIdentity:
        calls.append("full")
        return full()

    quick = Readings(ServerIdentity(A.model_path, A.served_model_name, ""), B)

    def model_only() -> ServerIdentity:
        calls.append("quick")
        return quick()

    server = ServerModel(fetch, quick=model_only)
    server.refresh()
    server.confirm("Model-A")  # the same model: /model_info alone, the version kept
    assert calls == ["full", "quick"] and server.current == A
    with pytest.raises(WrongModel):
        server.confirm("Model-A")  # another model: the whole identity read again
    assert calls == ["full", "quick", "quick", "full"] and server.current == B


def test_the_clients_quick_reading_is_the_model_alone() -> None:
    config = SimConfig(port=0, model="/dev/shm/models/Qwen3.6-27B", served_model_name="qwen-27b")
    with start_simulator(config) as sim:
        assert SGLangClient(sim.url).model_identity() == ServerIdentity(
            "/dev/shm/models/Qwen3.6-27B", "qwen-27b", ""
        )


# --- the consumer switch follows the model -------------------------------------------------------


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
