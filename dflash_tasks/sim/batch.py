"""A decode batch whose speed depends on its size: the simulator's throughput curve.

Without a curve every simulated request runs at ``tokens_per_second`` whatever else is running, so
throughput grows with the batch until ``--max-running-requests``. With one (``--curve`` or the
``--batch-*`` / ``--kv-*`` flags), the running requests share one decode loop, as on a GPU:

* a decode step takes ``base * sqrt(1 + (B / knee)^2)`` seconds for a batch of ``B``: flat while
  memory-bound, then growing linearly once compute-bound (``knee``: the batch where that starts);
  ``base`` is chosen so that one request alone runs at ``tokens_per_second``;
* above the decode graph ceiling (``graph_max_bs``, SGLang's ``--cuda-graph-max-bs-decode``) a step
  is ``eager_slowdown`` times slower: the batch has left the captured graphs;
* the accept length falls with the batch, ``1 + (a0 - 1) / (1 + B / accept_halving)``: a bigger
  batch gains less from speculative decoding (``a0``: ``--accept-length``);
* new requests are admitted at most ``prefill_tokens`` prompt tokens per decode step (at least one
  request a step; 0: all at once), as SGLang's chunked prefill budgets them
  (``--chunked-prefill-size``, ``--max-prefill-tokens``): a burst of new requests (a job's start,
  a refill) shows running under the target and a queue for a step or several, admission lag;
* the KV cache holds ``kv_capacity`` tokens (prompt + generated tokens of every running request).
  A request is admitted when its prompt, its tokens so far and ``reserve_ratio`` of its remaining
  budget fit beside the running ones' reservations (SGLang's ``new_token_ratio``); when decoding
  outgrows the cache, the request with the fewest generated tokens is retracted to the front of
  the queue (its tokens are kept, as SGLang keeps ``output_ids``) and the batch stalls for
  ``RETRACT_STALL_STEPS`` steps, the re-prefill.

Every running request advances by the same number of tokens per second, so one number (the
"virtual" progress ``v``) tells how far each one is: a request admitted at ``v0`` that needs ``n``
tokens finishes when ``v`` reaches ``v0 + n``. One driver thread moves ``v`` between events
(arrivals, completions, the cache filling up), so the cost is per event, not per token.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dflash_tasks.sim.scheduler import Stopped

#: Decode steps the batch loses to re-prefilling a retracted request.
RETRACT_STALL_STEPS = 10


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """How fast a batch of ``B`` running requests decodes (see the module docstring)."""

    tokens_per_second: float  # one request alone (the simulator's ``--tokens-per-second``)
    accept_length: float  # at batch 1 (``--accept-length``)
    knee: float = 0.0  # 0: a step takes the same time whatever the batch
    accept_halving: float = 0.0  # 0: the accept length does not fall with the batch
    graph_max_bs: int = 0  # 0: no decode graph ceiling
    eager_slowdown: float = 1.5
    kv_capacity: int = 0  # tokens; 0: unlimited
    reserve_ratio: float = 0.3
    prefill_tokens: int = 0  # prompt tokens admitted per decode step; 0: unlimited

    def __post_init__(self) -> None:
        checks = (
            (self.tokens_per_second > 0, "tokens_per_second must be > 0"),
            (self.accept_length >= 1, "accept_length must be >= 1"),
            (self.knee >= 0, "batch knee must be >= 0"),
            (self.accept_halving >= 0, "accept halving batch must be >= 0"),
            (self.graph_max_bs >= 0, "graph ceiling must be >= 0"),
            (self.eager_slowdown >= 1, "eager slowdown must be >= 1"),
            (self.kv_capacity >= 0, "kv capacity must be >= 0"),
            (0 <= self.reserve_ratio <= 1, "kv reserve ratio must be in [0, 1]"),
            (self.prefill_tokens >= 0, "prefill tokens per step must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def accept(self, batch: int) -> float:
        """Mean accept length at ``batch`` running requests."""
        if self.accept_halving <= 0:
            return self.accept_length
        return 1.0 + (self.accept_length - 1.0) / (1.0 + max(batch, 1) / self.accept_halving)

    def step_seconds(self, batch: int) -> float:
        """One decode step (verify pass) for ``batch`` running requests, unscaled."""
        base = self.accept(1) / self.tokens_per_second
        b = max(batch, 1)
        step = base * math.sqrt(1.0 + (b / self.knee) ** 2) if self.knee > 0 else base
        if self.graph_max_bs and b > self.graph_max_bs:
            step *= self.eager_slowdown
        return step

    def request_rate(self, batch: int) -> float:
        """Tokens per second each running request gets at ``batch`` (unscaled)."""
        return self.accept(batch) / self.step_seconds(batch)

    def throughput(self, batch: int) -> float:
        """Tokens per second of the whole batch (unscaled)."""
        return batch * self.request_rate(batch)


#: The named curves' prefill budget per decode step (prompt tokens): SGLang's chunked prefill size
#: on a smaller GPU; a job's burst of new requests is admitted over several steps.
PREFILL_TOKENS = 2048

#: Named curves for ``--curve``: the knobs above, for the tune benchmark and the docs. Each one's
#: optimum is what the benchmark expects the tuner to find; ``flat`` is the simulator without a curve.
CURVES: dict[str, dict[str, Any]] = {
    "flat": {},
    # optimum near 48: compute-bound early, and MTP's gain halves by batch 30
    "opt48": {"knee": 32, "accept_halving": 30, "prefill_tokens": PREFILL_TOKENS},
    # optimum at 128: the decode graph ceiling; above it a step is 1.5 times slower
    "opt128": {"knee": 200, "accept_halving": 200, "graph_max_bs": 128, "prefill_tokens": PREFILL_TOKENS},
    # optimum near 200: a large GPU with a small model (flat top from about 180 to the ceiling)
    "opt200": {"knee": 150, "accept_halving": 150, "graph_max_bs": 256, "prefill_tokens": PREFILL_TOKENS},
    # the KV cache binds first (about 90 requests of this workload fit), long before compute does
    "kvbound": {"knee": 400, "kv_capacity": 140_000, "prefill_tokens": PREFILL_TOKENS},
}


def curve_from(name: str | None, base: BatchCurve) -> BatchCurve:
    """``base`` with the named curve's knobs applied; raises ``ValueError`` for an unknown name."""
    if not name:
        return base
    if name not in CURVES:
        raise ValueError(f"unknown curve {name!r}; expected one of {sorted(CURVES)}")
    return replace(base, **CURVES[name])


@dataclass(frozen=True, slots=True)
class BatchRun:
    """How one request's generation went: its retractions and the accept length it saw."""

    retractions: int
    accept_length: float


class DecodeSeq:
    """One request in the decode batch (waiting or running)."""

    __slots__ = (
        *("accept_area", "area0", "done", "end_v", "event", "prompt"),
        *("retractions", "start_v", "t_area", "time0", "total"),
    )

    def __init__(self, total: int, prompt: int) -> None:
        self.total = total
        self.prompt = prompt
        self.done = 0  # tokens generated before its last admission (kept across retractions)
        self.start_v = 0.0
        self.end_v = 0.0  # where it finishes while running (heap entries with another value are stale)
        self.retractions = 0
        self.accept_area = 0.0  # time integral of the accept length while running
        self.t_area = 0.0  # time running
        self.area0 = self.time0 = 0.0  # the batch's integrals when it was last admitted
        self.event = threading.Event()


class DecodeBatch:
    """The running requests of one simulated server, decoding together (thread-safe)."""

    def __init__(
        self, curve: BatchCurve, time_scale: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.curve = curve
        self.time_scale = time_scale
        self._clock = clock
        self._cond = threading.Condition()
        self._running: dict[DecodeSeq, None] = {}  # admission order
        self._heap: list[tuple[float, int, DecodeSeq]] = []
        self._waiting: deque[DecodeSeq] = deque()
        self._ids = itertools.count()
        self._v = 0.0
        self._t = clock()
        self._stall_until = 0.0
        self._admit_at = 0.0  # with a prefill budget: the next decode step that may admit
        self._sum_prompt = 0  # KV: sum of (prompt + done) of the running
        self._sum_start = 0.0
        self._sum_end = 0.0  # sum of start_v + total - done: where each running request ends
        self._retractions = 0
        # The batch's own integrals (accept length over time, time decoding): a request's share is
        # their difference between its admission and its removal, so an event costs O(1), not O(B).
        self._accept_integral = 0.0
        self._time_integral = 0.0
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public
    def run(self, tokens: int, prompt_tokens: int, stop: threading.Event) -> BatchRun:
        """Block until ``tokens`` have been generated for this request; raises :class:`Stopped`."""
        if tokens <= 0 or self.time_scale <= 0:
            return BatchRun(0, self.curve.accept(1))
        seq = self.submit(tokens, prompt_tokens)
        while not seq.event.wait(0.5):
            if stop.is_set() or self._stopped:
                raise Stopped
        return self.outcome(seq)

    def submit(self, tokens: int, prompt_tokens: int) -> DecodeSeq:
        """Queue a request of ``tokens`` tokens; its ``event`` is set once they are generated."""
        seq = DecodeSeq(tokens, prompt_tokens)
        with self._cond:
            if self._stopped:
                raise Stopped
            self._ensure_driver()
            self._waiting.append(seq)
            self._cond.notify_all()
        return seq

    def outcome(self, seq: DecodeSeq) -> BatchRun:
        """How a finished request went; raises :class:`Stopped` when the batch stopped first."""
        if self._stopped and seq.done < seq.total:
            raise Stopped
        accept = seq.accept_area / seq.t_area if seq.t_area > 0 else self.curve.accept(1)
        return BatchRun(seq.retractions, accept)

    def progress(self, seq: DecodeSeq) -> tuple[int, float]:
        """(tokens generated so far, tokens per real second it gets now) for a submitted request."""
        with self._cond:
            self._advance(self._clock())
            if seq in self._running:
                return min(seq.total, int(seq.done + self._v - seq.start_v)), self._rate(len(self._running))
            return seq.done, 0.0

    def cancel(self, seq: DecodeSeq) -> int:
        """Take a request out (its client went away): its tokens generated so far."""
        with self._cond:
            self._advance(self._clock())
            if seq in self._running:
                generated = min(seq.total, int(seq.done + self._v - seq.start_v))
                self._remove(seq)
                seq.done = generated
            elif seq in self._waiting:
                self._waiting.remove(seq)
            self._cond.notify_all()
            return seq.done

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            for seq in [*self._running, *self._waiting]:
                seq.event.set()
            self._cond.notify_all()

    def gauges(self) -> dict[str, float]:
        """What SGLang's scheduler reports: running, queued for the cache, KV use, throughput."""
        with self._cond:
            self._advance(self._clock())
            b = len(self._running)
            used = self._kv_used()
            cap = self.curve.kv_capacity
            return {
                "running": b,
                "waiting": len(self._waiting),
                "retracted_waiting": sum(1 for s in self._waiting if s.retractions),
                "kv_used_tokens": used,
                "token_usage": used / cap if cap else 0.0,
                "gen_throughput": b * self._rate(b),
                "accept_length": self.curve.accept(b) if b else 0.0,
                "retractions_total": self._retractions,
            }

    # ------------------------------------------------------------------ the driver
    def _ensure_driver(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drive, name="sim-decode", daemon=True)
            self._thread.start()

    def _rate(self, batch: int) -> float:
        """Tokens per real second each running request gets (0 while stalled or empty)."""
        if batch == 0:
            return 0.0
        return self.curve.request_rate(batch) / self.time_scale

    def _kv_used(self) -> float:
        return self._sum_prompt + len(self._running) * self._v - self._sum_start

    def _advance(self, now: float) -> None:
        dt = now - max(self._t, min(now, self._stall_until))
        b = len(self._running)
        if dt > 0 and b:
            self._v += self._rate(b) * dt
            self._accept_integral += self.curve.accept(b) * dt
            self._time_integral += dt
        self._t = now

    def _drive(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self._clock()
                self._advance(now)
                self._finish_done()
                self._admit(now)
                self._retract_overflow(now)
                self._cond.wait(self._next_event(now))

    def _finish_done(self) -> None:
        eps = 1e-9
        while self._heap and self._heap[0][0] <= self._v + eps:
            entry = heapq.heappop(self._heap)
            if self._stale(entry):
                continue  # retracted since
            seq = entry[2]
            self._remove(seq)
            seq.done = seq.total
            seq.event.set()

    def _stale(self, entry: tuple[float, int, DecodeSeq]) -> bool:
        return entry[2] not in self._running or entry[0] != entry[2].end_v

    def _remove(self, seq: DecodeSeq) -> None:
        del self._running[seq]
        seq.accept_area += self._accept_integral - seq.area0
        seq.t_area += self._time_integral - seq.time0
        self._sum_prompt -= seq.prompt + seq.done
        self._sum_start -= seq.start_v
        self._sum_end -= seq.end_v

    def _fits(self, seq: DecodeSeq) -> bool:
        cap = self.curve.kv_capacity
        if not cap or not self._running:
            return True
        ratio = self.curve.reserve_ratio
        reserved = ratio * (self._sum_end - len(self._running) * self._v)
        need = seq.prompt + seq.done + ratio * (seq.total - seq.done)
        return self._kv_used() + reserved + need <= cap

    def _admit(self, now: float) -> None:
        budgeted = budget = self.curve.prefill_tokens
        if budgeted and now < self._admit_at:
            return  # this step's prefill budget is spent
        admitted = 0
        while self._waiting and self._fits(self._waiting[0]):
            seq = self._waiting[0]
            if budgeted and admitted and seq.prompt + seq.done > budget:
                break  # the next step admits it
            self._waiting.popleft()
            budget -= seq.prompt + seq.done
            admitted += 1
            seq.start_v = self._v
            seq.area0, seq.time0 = self._accept_integral, self._time_integral
            self._running[seq] = None
            self._sum_prompt += seq.prompt + seq.done
            self._sum_start += seq.start_v
            seq.end_v = seq.start_v + seq.total - seq.done
            self._sum_end += seq.end_v
            heapq.heappush(self._heap, (seq.end_v, next(self._ids), seq))
        if budgeted and admitted:
            self._admit_at = now + self.curve.step_seconds(len(self._running)) * self.time_scale

    def _retract_overflow(self, now: float) -> None:
        cap = self.curve.kv_capacity
        while cap and len(self._running) > 1 and self._kv_used() > cap:
            # the fewest tokens generated: the latest admitted among those with nothing done before
            seq = min(self._running, key=lambda s: (s.done + self._v - s.start_v, -s.prompt))
            generated = self._v - seq.start_v
            self._remove(seq)
            seq.done += int(generated)
            seq.retractions += 1
            self._retractions += 1
            self._waiting.appendleft(seq)
            stall = RETRACT_STALL_STEPS * self.curve.step_seconds(len(self._running)) * self.time_scale
            self._stall_until = max(self._stall_until, now) + stall

    def _next_event(self, now: float) -> float:
        """Seconds until the next completion or the cache filling up (at most 1 s)."""
        wait = 1.0
        if self._waiting and self.curve.prefill_tokens and now < self._admit_at:
            wait = self._admit_at - now  # the next step's admissions
        if now < self._stall_until:
            return max(1e-4, min(wait, self._stall_until - now))
        b = len(self._running)
        rate = self._rate(b)
        if not rate:
            return wait
        while self._heap and self._stale(self._heap[0]):
            heapq.heappop(self._heap)
        if self._heap:
            wait = min(wait, (self._heap[0][0] - self._v) / rate)
        cap = self.curve.kv_capacity
        if cap:
            room = cap - self._kv_used()
            wait = min(wait, room / (b * rate))
            if self._waiting:  # the running shrink their reservation as they decode
                wait = min(wait, 0.05)
        return max(1e-4, wait)
