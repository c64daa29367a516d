"""What the in-flight tuner is told: its settings (:class:`TunerConfig`) and the server's numbers
over one window at one target (:class:`Window`). The policy that reads them is
:class:`workers.flow.inflight_tuner.InflightTuner`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TunerConfig:
    floor: int = 8
    ceiling: int = 256
    start: int = 48
    grow: float = 1.5
    fine_grow: float = 1.2
    gain: float = 0.03
    #: A climbing step that reads less than ``gain`` better than the best, but no more than this
    #: share worse, is within one window's noise: it is measured again before the climb stops.
    noise: float = 0.10
    queue_band: float = 0.25
    kv_threshold: float = 0.95
    recheck_windows: int = 20
    probe_step: float = 0.08
    #: Standard errors a settled neighbour must beat the settled target by (besides ``gain``).
    noise_z: float = 2.5
    #: KV use from which a persistent queue says the cache binds (SGLang stops admitting well
    #: before the cache is full: it reserves room for the running requests' remaining tokens).
    kv_full: float = 0.5
    #: The server's ``max_running_requests`` (from ``/server_info``); 0: not known.
    server_running_cap: int = 0
    #: A window whose server saw (running + queued) under this share of its target is short.
    seen_share: float = 0.8
    #: Short windows held in a row at one target; the next one is judged. On the real CPU engine,
    #: its two cores shared, a job's ramp lasted three windows and more (2 let one through).
    short_windows: int = 5
    #: Targets a climbing step must not jump over: the server's decode graph ceiling, above
    #: which a batch leaves the fast path (the best target is often exactly there).
    breakpoints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"in-flight floor {self.floor} must be in 1..ceiling ({self.ceiling})")
        if self.grow <= 1 or self.fine_grow <= 1:
            raise ValueError("grow and fine_grow must be > 1")


@dataclass(frozen=True, slots=True)
class Window:
    """What the server did over one window at one target."""

    target: int
    seconds: float
    tokens_per_s: float
    running: float = 0.0  # mean running requests (sglang:num_running_reqs)
    queued: float = 0.0  # mean queued requests (sglang:num_queue_reqs)
    token_usage: float = 0.0  # highest KV use seen (sglang:token_usage)
    retractions: int = 0  # requests retracted in the window
    accept_length: float = 0.0
    #: The worker's own completed tokens per second (``tokens_per_s`` is this where it is the
    #: better measure: see :data:`workers.flow.tuner_loop.MANY_COMPLETIONS`).
    completed_tokens_per_s: float = 0.0
    #: The first window after the start or after the worker refilled its pool (a job or chunk
    #: boundary): the server admits the burst a few requests per step, so its queue is not judged.
    fresh: bool = False
