"""The in-flight tuner's policy: which target to try next, from windows of the server's numbers.

Pure (no threads, no I/O): :class:`InflightTuner` is fed one :class:`Window` per measurement
(the target it ran at, the server's generated tokens per second, running and queued requests,
KV use, retractions, accept length) and answers with the next target. It climbs while throughput
rises, stops on the server's warnings, settles on the best target it measured and re-checks its
neighbours now and then, because the best concurrency drifts over a job:

* **climb**: from the start target, times ``grow`` per window while tokens/s rise by more than
  ``gain``; at the first step that does not, one finer step (times ``fine_grow``) above the best,
  then settle on the best. A flat curve settles on the lower target (fewer requests, less KV).
  One window is enough to climb, not to stop: a step that does not beat the best but reads within
  ``noise`` of it is measured again, and the best too when it has one window only (the climb goes
  back to it for a fresh one), and the means decide; a step clearly worse stops at once. A window
  is noisy where the batch comes in waves: on the real CPU engine windows at a fixed target
  scattered by 6% (standard deviation) around their mean, and a 12% gain from 48 to 72 was once
  lost to a single window: the climb stopped at 48 and the job ran at 0.75 of the best.
* **guards**: a retraction, a server queue past ``queue_band`` of its running requests, or KV use
  past ``kv_threshold`` means the server is out of room at this target: the tuner goes back to
  the best target below it and never climbs to this one again. A queue while climbing settles on
  what the server admits plus half the band (its cache or its cap binds there, and a small queue
  keeps it full).
* **settled**: every ``recheck_windows`` windows it tries ±``probe_step`` around the target and
  moves when a neighbour, over two windows, beats the mean of the settled windows by more than
  ``gain`` and more than ``noise_z`` standard errors of the difference (the settled windows' own
  scatter says how noisy one is); one window not better by ``gain`` is enough to stay. On the CPU
  engine (windows scattered by 6%) moves on one window beating the last settled one by 3% walked a
  flat curve's target 58 -> 63 -> 68 within one job. It never probes into a target the server
  refused. A retraction or KV use past the threshold while settled lowers the target by
  ``probe_step``. A queue then only stops a probe upwards: it does not cut, because a server whose
  prefill lags (new requests wait their turn while the batch decodes) shows one at every target,
  and cutting on it would walk the target down to the floor whatever the throughput (seen on the
  real CPU engine); below, tokens/s decide.
* **short windows**: a window whose server saw (running plus queued) under ``seen_share`` of the
  target is held: neither a move nor a baseline for the next comparison, as if it had not been
  measured, except that a retraction or KV use past the threshold still counts. The pool's requests
  were still reaching the server (a job's start, a refill), so its tokens/s rise with that ramp, not
  with the target: on the real CPU engine windows of 24 running of 48 read as a rising curve and the
  climb went up on them, then down hard. A fresh window held passes its freshness to the next one
  judged. After ``short_windows`` held in a row at one target the next is judged anyway: a
  shortfall that stands is what the server does at that target, not a ramp.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from enum import StrEnum

from dflash_tasks.core.tuner_state import TunerPoint, TunerState
from workers.flow.tuner_inputs import TunerConfig, Window


class Phase(StrEnum):
    CLIMB = "climbing"
    SETTLED = "settled"
    PROBE_UP = "probing up"
    PROBE_DOWN = "probing down"


class Reason(StrEnum):
    """Why the tuner is where it is (shown in progress.json, status, Prometheus and the log)."""

    STARTING = "starting"
    RISING = "throughput rising"
    FINER = "the step was no better: a finer one"
    CONFIRMING = "measuring a step again"
    RECHECKING = "measuring the best again"
    FLAT = "throughput stopped rising"
    CEILING = "at the ceiling"
    RETRACTIONS = "the server retracted requests"
    QUEUE = "the server queued requests past the band"
    KV = "KV cache use past the threshold"
    PROBING = "re-checking a neighbour"
    HELD = "no better neighbour"
    MOVED = "a neighbour was better"


@dataclass(slots=True)
class CurvePoint:
    """The measured curve at one target: the latest window's figures, and how many windows."""

    target: int
    tokens_per_s: float
    accept_length: float
    token_usage: float
    windows: int = 1

    def reported(self) -> TunerPoint:
        """The point as the tuner reports it (its figures rounded)."""
        return TunerPoint(
            target=self.target,
            tokens_per_s=round(self.tokens_per_s, 1),
            accept_length=round(self.accept_length, 3),
            token_usage=round(self.token_usage, 3),
            windows=self.windows,
        )


@dataclass(slots=True)
class InflightTuner:
    config: TunerConfig
    target: int = 0
    phase: Phase = Phase.CLIMB
    reason: Reason = Reason.STARTING
    best: int = 0
    best_tps: float = 0.0
    limit: int = 0  # guarded: never this many or more
    curve: dict[int, CurvePoint] = field(default_factory=dict)
    _fine: bool = False
    #: The climb's windows, tokens/s per target (its decisions take the mean).
    _climb_tps: dict[int, list[float]] = field(default_factory=dict)
    #: The step that sent the climb back to measure the best again.
    _pending_step: int = 0
    #: Tokens/s of each window since it settled (kept while it probes: the neighbour must beat
    #: them), and of each window at the neighbour it probes.
    _settled_reads: list[float] = field(default_factory=list)
    _probe_reads: list[float] = field(default_factory=list)
    #: The running count of each window in a row whose queue was past the band (not fresh).
    _queued_running: list[tuple[int, float]] = field(default_factory=list)
    #: The target of the last window and how many short windows in a row it had.
    _short: tuple[int, int] = (0, 0)
    #: A fresh window was held: the next one judged is fresh in its place.
    _fresh_due: bool = False
    #: The last window was held (short): it moved nothing and set no baseline.
    held: bool = False

    def __post_init__(self) -> None:
        self.limit = self.config.ceiling + 1
        self.target = self._clamp(self.config.start)

    def _step(self, frm: int, factor: float) -> int:
        """``frm * factor``, clamped, and no further than the first breakpoint above ``frm``."""
        nxt = self._clamp(frm * factor)
        for point in sorted(self.config.breakpoints):
            if frm < point < nxt:
                return point
        return nxt

    def _clamp(self, n: float) -> int:
        return max(self.config.floor, min(self.config.ceiling, self.limit - 1, round(n)))

    def _out_of_room(self, w: Window) -> Reason | None:
        """The server's hard evidence that it is full: retractions, KV use past the threshold."""
        if w.retractions > 0:
            return Reason.RETRACTIONS
        return Reason.KV if w.token_usage > self.config.kv_threshold else None

    def _is_held(self, w: Window) -> bool:
        """Is ``w`` short (the server saw under ``seen_share`` of the target; a server that reports
        neither gauge is judged on tokens/s alone) and within ``short_windows`` in a row?"""
        seen = w.running + w.queued
        if not 0 < seen < self.config.seen_share * w.target:
            self._short = (w.target, 0)
            return False
        target, count = self._short
        count = 1 if w.fresh or target != w.target else count + 1
        self._short = (w.target, count)
        return count <= self.config.short_windows

    def _guard(self, w: Window) -> Reason | None:
        cfg = self.config
        hard = self._out_of_room(w)
        if hard is not None:
            return hard
        queued = not w.fresh and w.queued >= 2 and w.queued > cfg.queue_band * max(w.running, 1.0)
        same = self._queued_running and self._queued_running[-1][0] == w.target
        kept = self._queued_running[-1:] if same else []  # the last window is all _server_full reads
        self._queued_running = [*kept, (w.target, w.running)] if queued else []
        if not queued:
            return None
        # A queue says "no higher" above the start, never "lower" there: a full server decodes
        # as fast with a queue, and one that admits requests as it frees room keeps it full. At or
        # below the start a full server (not lag) takes the target down to what it runs.
        if w.target > self._clamp(cfg.start):
            return Reason.QUEUE if self.phase in (Phase.CLIMB, Phase.PROBE_UP) else None
        return Reason.QUEUE if self._server_full(w) else None

    def _server_full(self, w: Window) -> bool:
        """Does the queue say the server is full, not that it admits a burst a few per step? It
        persisted over two windows or more at this target, the running count stopped rising, and
        it sits at what the server can hold (90% of its ``max_running_requests``, or a cache in real
        use); with the cap unknown, the flat running count alone says so."""
        runs = [running for _, running in self._queued_running]
        if len(runs) < 2 or runs[-1] > runs[-2] * 1.05:
            return False
        cap = self.config.server_running_cap
        return not cap or w.running >= 0.9 * cap or w.token_usage >= self.config.kv_full

    def _record(self, w: Window) -> None:
        point = self.curve.get(w.target)
        if point is None:
            self.curve[w.target] = CurvePoint(w.target, w.tokens_per_s, w.accept_length, w.token_usage)
        else:
            point.tokens_per_s, point.accept_length = w.tokens_per_s, w.accept_length
            point.token_usage, point.windows = w.token_usage, point.windows + 1

    def _settle(self, target: float, reason: Reason) -> int:
        self.phase, self.reason = Phase.SETTLED, reason
        self.target = self._clamp(target)
        self._settled_reads = []
        return self.target

    def observe(self, w: Window) -> int:
        """Take one window measured at ``w.target``; return the next target."""
        self.held = False
        if w.target != self.target:  # a stale window (the target moved meanwhile): ignore it
            return self.target
        self.held = self._is_held(w)
        if self.held:
            hard = self._out_of_room(w)
            if hard is not None:
                return self._on_guard(w, hard)
            self._fresh_due = self._fresh_due or w.fresh
            self._queued_running = []  # a queue persists only over windows the server saw whole
            return self.target
        if self._fresh_due:
            w, self._fresh_due = replace(w, fresh=True), False
        self._record(w)
        guard = self._guard(w)
        if guard is not None:
            return self._on_guard(w, guard)
        if self.phase is Phase.CLIMB:
            return self._climb(w)
        if self.phase is Phase.SETTLED:
            self._settled_reads.append(w.tokens_per_s)
            if len(self._settled_reads) >= self.config.recheck_windows:
                self.best, self.best_tps = self.target, statistics.fmean(self._settled_reads)
                step = min(self.config.ceiling, round(self.target * (1 + self.config.probe_step)))
                if self.target < step < self.limit:  # not into a target the server refused
                    return self._probe(Phase.PROBE_UP, step)
                return self._probe_down()
            return self.target
        self._probe_reads.append(w.tokens_per_s)
        verdict = self._neighbour_verdict()
        if verdict is True:
            return self._settle(w.target, Reason.MOVED)
        if verdict is None:  # better on one window, not past the noise yet: one more
            self.reason = Reason.CONFIRMING
            return self.target
        if self.phase is Phase.PROBE_UP:
            return self._probe_down()
        # PROBE_DOWN: go down only when it is better, not merely as good (noise would walk it down)
        return self._settle(self.best, Reason.HELD)

    def _neighbour_verdict(self) -> bool | None:
        """Is the probed neighbour better than the settled windows (``best_tps``, their mean)?
        None: not sure yet. The settled windows' own scatter says how noisy a window is."""
        cfg = self.config
        reads, settled = self._probe_reads, self._settled_reads
        mean = statistics.fmean(reads)
        if len(reads) < 2:  # one window is enough to stay, not to move
            return None if mean > self.best_tps * (1 + cfg.gain) else False
        noise = statistics.stdev(settled) / self.best_tps if len(settled) > 1 and self.best_tps > 0 else 0.0
        stderr = noise * math.sqrt(1 / len(reads) + 1 / len(settled))
        return mean > self.best_tps * (1 + max(cfg.gain, cfg.noise_z * stderr))

    def _probe(self, phase: Phase, target: int) -> int:
        self.phase, self.target, self._probe_reads = phase, target, []
        self.reason = Reason.PROBING
        return target

    def _probe_down(self) -> int:
        down = self._clamp(self.best * (1 - self.config.probe_step))
        if down >= self.best:
            return self._settle(self.best, Reason.HELD)
        return self._probe(Phase.PROBE_DOWN, down)

    def _on_guard(self, w: Window, guard: Reason) -> int:
        self.limit = min(self.limit, w.target)
        if guard is Reason.QUEUE:
            # The server runs only so many (its cache or its cap binds): keep it that full, with
            # half the band queued so a finishing request is replaced at once. Below the start
            # only when the queue says the server is full (else it is admission lag).
            admitted = round(w.running * (1 + self.config.queue_band / 2))
            full = self._server_full(w)
            floor = self.best if self.best < w.target else 0
            if not full:
                floor = max(floor, self._clamp(self.config.start))
            if self.phase is Phase.PROBE_UP and not full:
                return self._settle(self.best, guard)
            return self._settle(max(floor, min(w.target - 1, admitted)), guard)
        if self.phase is Phase.CLIMB and self.best and self.best < w.target:
            return self._settle(self.best, guard)
        if self.phase in (Phase.PROBE_UP, Phase.PROBE_DOWN) and self.best < w.target:
            return self._settle(self.best, guard)
        return self._settle(w.target * (1 - self.config.probe_step), guard)

    def _climb(self, w: Window) -> int:
        cfg = self.config
        reads = self._climb_tps.setdefault(w.target, [])
        reads.append(w.tokens_per_s)
        mean = self._climb_mean(w.target)
        if self._pending_step:  # back at the best for a fresh window: does the step beat it now?
            step, self._pending_step = self._pending_step, 0
            self.best_tps = mean
            step_mean = self._climb_mean(step)
            if step_mean > mean * (1 + cfg.gain):
                return self._climb_from(step, step_mean)
            return self._stop_climb(step)
        if not self.best or mean > self.best_tps * (1 + cfg.gain):
            return self._climb_from(w.target, mean)
        if mean < self.best_tps * (1 - cfg.noise):  # clearly worse (past a graph ceiling, say)
            return self._stop_climb(w.target)
        if len(reads) < 2:  # within noise of the best: one more window here
            self.reason = Reason.CONFIRMING
            return self.target
        if len(self._climb_tps[self.best]) < 2:
            self._pending_step, self.reason = w.target, Reason.RECHECKING
            self.target = self.best
            return self.best
        return self._stop_climb(w.target)

    def _climb_mean(self, target: int) -> float:
        return statistics.fmean(self._climb_tps[target])

    def _climb_from(self, target: int, tps: float) -> int:
        """``target`` is the best so far: the next step above it (or settle at the ceiling)."""
        self.best, self.best_tps, self.reason = target, tps, Reason.RISING
        nxt = self._step(target, self.config.fine_grow if self._fine else self.config.grow)
        if nxt <= target:
            return self._settle(target, Reason.CEILING)
        self.target = nxt
        return nxt

    def _stop_climb(self, step: int) -> int:
        """``step`` did not beat the best: one finer step above the best first, then settle."""
        if not self._fine:
            self._fine = True
            nxt = self._step(self.best, self.config.fine_grow)
            if self.best < nxt < step:
                self.target, self.reason = nxt, Reason.FINER
                return nxt
        return self._settle(self.best, Reason.FLAT)

    def state(self) -> TunerState:
        """Target, phase, reason, bounds and the measured curve (sorted by target)."""
        return TunerState(
            target=self.target,
            phase=self.phase.value,
            reason=self.reason.value,
            floor=self.config.floor,
            ceiling=self.config.ceiling,
            curve=tuple(self.curve[t].reported() for t in sorted(self.curve)),
        )
