"""The in-flight tuner's loop: measure the server a window at a time, move the pool's target.

Every ``sample_seconds`` it reads the server's gauges (:meth:`SGLangClient.load`); a window is
``window_seconds`` long, or as long as a request takes when that is longer (estimated from the
requests in flight and the rate they finish: Little's law), so on a GPU where a thinking request
takes a minute a window spans one. The first half-window after a cut is not measured, while the
batch shrinks (a quarter after a raise: the new requests start at once). Tokens per second are the
mean of ``sglang:gen_throughput`` over the window, or the worker's own completed tokens where those
say more: when the server reports no rate, or when the window saw many requests finish
(:data:`MANY_COMPLETIONS` per slot), so that a count of what was stored is exact where the gauge
is a sample of the server's last few decode steps. It is a
:class:`~workers.monitor.listener.WorkerListener` too: finished samples tell it the completion rate and
the retractions the server reported per request. A window in which the worker did not keep its
target in flight (no work, the end of a job) is dropped: it says nothing about the target.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from dflash_tasks.core.delivery_outcome import DeliveryOutcome
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.spec_stats import SampleCounts
from dflash_tasks.core.tuner_state import TunerState
from workers.flow.inflight_tuner import InflightTuner
from workers.flow.request_pool import RequestPool
from workers.flow.tuner_inputs import Window
from workers.sglang_client import ServerLoad

log = logging.getLogger(__name__)

#: The longest window (s), however long a request takes.
MAX_WINDOW_SECONDS = 600.0
#: A window counts only when the worker kept at least this share of its target in flight.
SATURATED = 0.9
#: Requests finished per slot of the target in a window, from which tokens/s are the worker's own
#: completed tokens rather than the server's gauge. Short requests: on the real CPU engine
#: (35-token answers, 6 s windows, 6 to 13 per slot) windows at a fixed target scattered by 6%
#: (standard deviation) around the job's rate by the count, by 10% by the gauge, which read 8%
#: under it on average. A GPU's thinking requests last a window or more: one per slot, there the
#: count is lumpy and the gauge decides.
MANY_COMPLETIONS = 4


class TunerLoop:
    """Runs an :class:`InflightTuner` against a :class:`RequestPool` on a background thread."""

    def __init__(
        self,
        tuner: InflightTuner,
        pool: RequestPool,
        load: Callable[[], ServerLoad],
        window_seconds: float = 30.0,
        sample_seconds: float = 1.0,
        on_change: Callable[[TunerState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        graph_ceiling: Callable[[], int | None] | None = None,
        running_cap: Callable[[], int | None] | None = None,
    ) -> None:
        self.tuner = tuner
        self.pool = pool
        self._load = load
        self.window_seconds = window_seconds
        self.sample_seconds = sample_seconds
        self._on_change = on_change
        self._clock = clock
        self._graph_ceiling = graph_ceiling
        self._running_cap = running_cap
        #: The next window follows the start or a refill of the pool: its queue is not judged.
        self._fresh = True
        self._lock = threading.Lock()
        self._finished = 0
        self._tokens = 0
        self._retractions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.windows = 0
        self._request_seconds = 0.0
        self._last_target = 0

    # ------------------------------------------------------------------ listener events
    def sample_done(self, job_id: str, counts: SampleCounts) -> None:
        with self._lock:
            self._finished += counts.generations
            self._tokens += counts.completion_tokens
            self._retractions += counts.retractions

    def request_failed(self, exc: BaseException, will_retry: bool) -> None:
        pass

    def chunk_started(self, job_id: str) -> None:
        if self.pool.running < SATURATED * self.pool.max_inflight:  # the pool refills
            self._fresh = True

    def chunk_stored(self, job_id: str, seconds: float) -> None:
        pass

    def delivery(self, outcome: DeliveryOutcome, redelivered: bool) -> None:
        pass

    def chunk_requeued(self, reason: str) -> None:
        pass

    # ------------------------------------------------------------------ the loop
    def state(self) -> TunerState:
        """The tuner's state (target, phase, reason, curve) plus the current window length and the
        completion tokens of every sample it heard of (its own count of the worker's output)."""
        window = round(self._window_length(), 1)
        return replace(self.tuner.state(), window_seconds=window, completed_tokens=self._counters()[1])

    def start(self) -> None:
        self.pool.set_target(self.tuner.target)
        self._thread = threading.Thread(target=self._run, name="dflash-tuner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _counters(self) -> tuple[int, int, int]:
        with self._lock:
            return self._finished, self._tokens, self._retractions

    def _learn_graph_ceiling(self) -> None:
        """Make the server's decode graph ceiling a breakpoint of the climb, once it is known."""
        if self._graph_ceiling is None:
            return
        try:
            ceiling = self._graph_ceiling()
        except DflashError:
            return  # not up yet: asked again before the next window
        self._graph_ceiling = None
        if ceiling and ceiling not in self.tuner.config.breakpoints:
            self.tuner.config = replace(
                self.tuner.config, breakpoints=(*self.tuner.config.breakpoints, ceiling)
            )

    def _learn_running_cap(self) -> None:
        """Tell the tuner the server's ``max_running_requests``, once it is known."""
        if self._running_cap is None:
            return
        try:
            cap = self._running_cap()
        except DflashError:
            return
        self._running_cap = None
        if cap:
            self.tuner.config = replace(self.tuner.config, server_running_cap=cap)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._learn_graph_ceiling()
            self._learn_running_cap()
            try:
                window = self.measure()
            except DflashError as exc:
                log.warning("in-flight tuner: cannot read the server's load (%s); holding", exc)
                self._stop.wait(max(self.window_seconds, 5.0))
                continue
            if window is None:
                continue
            self.apply(window)

    def apply(self, window: Window) -> int:
        """Feed one window to the tuner and move the pool to the target it answers."""
        before = self.tuner.target, self.tuner.phase, self.tuner.reason
        answer = self.tuner.observe(window)
        log.debug(
            "in-flight tuner window: %d at %.0f tok/s (completed: %.0f) over %.1fs, running %.1f, "
            "queued %.1f, KV %.2f%s",
            window.target,
            window.tokens_per_s,
            window.completed_tokens_per_s,
            window.seconds,
            window.running,
            window.queued,
            window.token_usage,
            _window_note(window, self.tuner.held),
        )
        target = self.pool.set_target(answer)
        self.windows += 1
        if (self.tuner.target, self.tuner.phase, self.tuner.reason) != before:
            log.info(
                "in-flight tuner: %d -> %d (%s: %s); %d at %.0f tok/s, running %.0f, queued %.0f, KV %.2f",
                before[0],
                target,
                self.tuner.phase.value,
                self.tuner.reason.value,
                window.target,
                window.tokens_per_s,
                window.running,
                window.queued,
                window.token_usage,
            )
            if self._on_change is not None:
                self._on_change(self.state())
        return target

    def measure(self) -> Window | None:
        """One window at the current target (None when stopped or when nothing ran)."""
        target = self.pool.max_inflight
        length = self._window_length()
        # After a raise the new requests start at once (a quarter of a window to settle); after a
        # cut the batch only shrinks as requests finish (half a window).
        settle = length / 4 if target >= self._last_target else length / 2
        self._last_target = target
        if self._stop.wait(settle):
            return None
        finished0, tokens0, retract0 = self._counters()
        started = self._clock()
        loads: list[ServerLoad] = []
        ours = 0  # the worker's own requests in flight, summed over the samples
        while self._clock() - started < length:
            loads.append(self._load())
            ours += self.pool.running
            if self._stop.wait(self.sample_seconds):
                return None
        seconds = self._clock() - started
        finished, tokens, retract = self._counters()
        if not loads or seconds <= 0:
            return None
        n = len(loads)
        running = sum(x.running for x in loads) / n
        if ours / n < SATURATED * target or self.pool.max_inflight != target:
            self._fresh = True  # the pool refills after this: the next window's queue is a burst
            return None  # short of work (idle, a job's drain) or moved meanwhile: nothing to learn
        fresh, self._fresh = self._fresh, False
        gauge = sum(x.gen_throughput for x in loads) / n
        own = (tokens - tokens0) / seconds
        self._observe_request_time(running, (finished - finished0) / seconds)
        counted = gauge <= 0 or finished - finished0 >= MANY_COMPLETIONS * target
        return Window(
            target=target,
            seconds=seconds,
            tokens_per_s=own if counted else gauge,
            running=running,
            queued=sum(x.queued for x in loads) / n,
            token_usage=max(x.token_usage for x in loads),
            retractions=(retract - retract0) + int(max(x.retracted for x in loads)),
            accept_length=sum(x.accept_length for x in loads) / n,
            completed_tokens_per_s=own,
            fresh=fresh,
        )

    def _observe_request_time(self, running: float, finished_per_s: float) -> None:
        """Little's law: requests in flight / completions per second = seconds per request."""
        if finished_per_s > 0:
            self._request_seconds = running / finished_per_s

    def _window_length(self) -> float:
        return min(MAX_WINDOW_SECONDS, max(self.window_seconds, self._request_seconds))


def _window_note(window: Window, held: bool) -> str:
    """The debug line's note on how the tuner took the window."""
    if held:
        return " (short: the server saw under the target; not judged)"
    return " (fresh: queue not judged)" if window.fresh else ""
