"""The prefetch controller against kombu's QoS, as Celery's consumer loop drives it."""

from __future__ import annotations

from collections.abc import Callable

from kombu.common import QoS

from workers.flow.prefetch import PrefetchController, prefetch_target


def test_target_grows_by_one_below_low_water_and_is_capped() -> None:
    assert prefetch_target(held=0, backlog=0, low_water=24, max_chunks=8) == 1
    assert prefetch_target(held=2, backlog=10, low_water=24, max_chunks=8) == 3
    assert prefetch_target(held=2, backlog=40, low_water=24, max_chunks=8) == 2
    assert prefetch_target(held=8, backlog=0, low_water=24, max_chunks=8) == 8


def test_the_consumer_loop_does_not_undo_the_controllers_prefetch() -> None:
    applied: list[int] = []
    qos = QoS(lambda prefetch_count: applied.append(prefetch_count), 8)  # concurrency x multiplier
    qos.update()
    held, backlog = [0], [100]
    controller = PrefetchController(lambda: held[0], lambda: backlog[0], low_water=24, max_chunks=8)
    controller.attach(qos)

    def consumer_loop_iteration() -> None:  # what celery.worker.loops.asynloop does every turn
        if qos.prev != qos.value:
            qos.update()

    consumer_loop_iteration()
    assert applied[-1] == 1 and qos.value == 1
    held[0], backlog[0] = 1, 10
    controller.tick()
    consumer_loop_iteration()
    assert applied[-1] == 2
    held[0], backlog[0] = 2, 80
    controller.tick()
    consumer_loop_iteration()
    assert applied[-1] == 2 and qos.value == 2


class FakeHub:
    """Records what the controller hands to the consumer's event loop."""

    def __init__(self) -> None:
        self.ready: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        self.ready.append((callback, args))

    def run_ready(self) -> None:
        ready, self.ready = self.ready, []
        for callback, args in ready:
            callback(*args)


def test_a_new_count_is_applied_on_the_event_loop() -> None:
    applied: list[int] = []
    qos = QoS(lambda prefetch_count: applied.append(prefetch_count), 8)
    hub = FakeHub()
    held, backlog = [1], [10]
    controller = PrefetchController(lambda: held[0], lambda: backlog[0], low_water=24, max_chunks=8)
    controller.attach(qos, hub)
    assert qos.value == 2 and applied == [2]  # attach runs on the consumer's thread: applied at once
    held[0] = 2
    controller.nudge()
    assert qos.value == 2 and not applied[1:]  # not yet: the event loop applies it (and wakes up)
    hub.run_ready()
    assert qos.value == 3 and applied[-1] == 3
    held[0], backlog[0] = 1, 60  # a chunk ended: lower the count before its message is acked
    controller.nudge()
    hub.run_ready()
    assert qos.value == 1 and applied[-1] == 1
