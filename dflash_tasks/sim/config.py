"""Simulator settings: one frozen dataclass, plus the fault description shared by CLI and HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.sim.batch import BatchCurve, curve_from

FAULT_KINDS = frozenset({"http_500", "http_503", "hang", "bad_json", "abort", "reset", "unhealthy"})
"""Fault kinds accepted by ``POST /sim/faults`` and ``--fault`` (plus ``clear`` over HTTP)."""

REASONING_PARSERS = ("qwen3", "none")

SPEC_NUM_DRAFT_TOKENS = 4
"""Tokens per verify pass (``--speculative-num-draft-tokens``; steps 3, top-k 1): the accept-length cap."""

DEFAULT_HANG_SECONDS = 60.0


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault.

    ``count`` limits it to the next N chat requests (N health probes for ``unhealthy``),
    ``seconds`` to a time span from its installation; with neither it lasts until cleared.
    """

    kind: str
    count: int | None = None
    seconds: float | None = None
    hang_seconds: float = DEFAULT_HANG_SECONDS

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if self.count is not None and self.count < 1:
            raise ValueError(f"fault count must be >= 1, got {self.count}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"fault seconds must be > 0, got {self.seconds}")
        if self.hang_seconds < 0:
            raise ValueError(f"hang_seconds must be >= 0, got {self.hang_seconds}")

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> FaultSpec:
        """Build from a ``POST /sim/faults`` body; raises ``ValueError`` on bad fields."""
        count = body.get("count")
        seconds = body.get("seconds")
        hang = body.get("hang_seconds", DEFAULT_HANG_SECONDS)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise ValueError("count must be an integer")
        for name, value in (("seconds", seconds), ("hang_seconds", hang)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{name} must be a number")
        return cls(
            kind=str(body.get("kind")),
            count=count,
            seconds=None if seconds is None else float(seconds),
            hang_seconds=float(hang),
        )

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse the CLI form ``KIND[:COUNT]``, e.g. ``http_500:20``."""
        kind, _, count = text.partition(":")
        return cls(kind=kind.strip(), count=int(count) if count else None)


@dataclass(frozen=True)
class SimConfig:
    """Everything the simulator can be told at startup (see ``python -m dflash_tasks.sim --help``)."""

    host: str = "127.0.0.1"
    port: int = 30000
    model: str = "Qwen/Qwen3-8B"
    served_model_name: str | None = None
    context_length: int = 32768
    max_running_requests: int = 48
    max_queued_requests: int | None = None
    tokens_per_second: float = 40.0
    time_scale: float = 1.0
    mean_output_tokens: int = 2300
    output_tokens_sigma: float = 0.6
    reasoning_fraction: float = 0.9
    seed: int = 0
    reasoning_parser: str = "qwen3"
    ignore_thinking_flag: bool = False
    accept_length: float = 3.6
    #: Spread (standard deviation) of the per-request accept length around ``accept_length``.
    accept_length_sd: float = 0.3
    #: Verify passes per "decode log interval": ``internal_states`` reports an accept length only
    #: after the first one (SGLang: ``--decode-log-interval`` 40 decode batches).
    decode_log_interval: int = 40
    #: Seconds the port refuses connections (SGLang loading weights, before HTTP is up).
    load_seconds: float = 0.0
    #: Seconds after HTTP is up during which ``/health*`` and ``/ready`` answer 503 (the warmup);
    #: chat requests are served meanwhile, as SGLang does.
    startup_seconds: float = 0.0
    #: ``--api-key``: every route but ``/health*``, ``/ready*``, ``/metrics*`` (and ``/sim/*``)
    #: then needs ``Authorization: Bearer <key>``.
    api_key: str | None = field(default=None, repr=False)
    #: A throughput curve (:mod:`dflash_tasks.sim.batch`): a named one (``--curve``), or the knobs.
    curve: str | None = None
    batch_knee: float = 0.0
    accept_halving_batch: float = 0.0
    cuda_graph_max_bs_decode: int = 0
    eager_slowdown: float = 1.5
    kv_capacity_tokens: int = 0
    kv_reserve_ratio: float = 0.3
    #: Share of the samples that fall into a loop (a sentence or paragraph repeated until
    #: ``max_tokens``), as real models do (:mod:`dflash_tasks.sim.textgen`).
    loop_share: float = 0.0
    #: ``--stream-interval``: a stream sends once this many tokens are unsent (1: every decode step).
    stream_interval: int = 1
    #: How often a request waiting for a slot has its connection checked (SGLang's
    #: ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, 4 s). Not scaled.
    disconnect_poll_seconds: float = 4.0
    #: A streaming client that takes no byte this long while some wait for it (its socket full) is
    #: dropped as gone: its request is aborted (:mod:`dflash_tasks.sim.outbox`). Not scaled.
    stream_stall_seconds: float = 60.0
    faults: tuple[FaultSpec, ...] = field(default_factory=tuple)
    verbose: bool = False
    #: Append every chat request body to this JSONL file (see :mod:`dflash_tasks.sim.requestlog`).
    record_requests: str | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.context_length >= 16, "context_length must be >= 16"),
            (self.max_running_requests >= 1, "max_running_requests must be >= 1"),
            (self.max_queued_requests is None or self.max_queued_requests >= 0, "max_queued_requests >= 0"),
            (self.tokens_per_second > 0, "tokens_per_second must be > 0"),
            (self.time_scale >= 0, "time_scale must be >= 0"),
            (self.mean_output_tokens >= 1, "mean_output_tokens must be >= 1"),
            (self.output_tokens_sigma >= 0, "output_tokens_sigma must be >= 0"),
            (0.0 <= self.reasoning_fraction < 1.0, "reasoning_fraction must be in [0, 1)"),
            (self.reasoning_parser in REASONING_PARSERS, f"reasoning_parser must be in {REASONING_PARSERS}"),
            (
                1.0 <= self.accept_length <= SPEC_NUM_DRAFT_TOKENS,
                f"accept_length must be in [1, {SPEC_NUM_DRAFT_TOKENS}]",
            ),
            (self.accept_length_sd >= 0, "accept_length_sd must be >= 0"),
            (self.decode_log_interval >= 1, "decode_log_interval must be >= 1"),
            (self.load_seconds >= 0, "load_seconds must be >= 0"),
            (self.startup_seconds >= 0, "startup_seconds must be >= 0"),
            (
                ":" not in self.served_name,
                "served_model_name cannot contain a colon (':') character (reserved for LoRA adapters)",
            ),
            (0 <= self.port <= 65535, "port must be in [0, 65535]"),
            (0.0 <= self.loop_share <= 1.0, "loop_share must be in [0, 1]"),
            (self.stream_interval >= 1, "stream_interval must be >= 1"),
            (self.disconnect_poll_seconds > 0, "disconnect_poll_seconds must be > 0"),
            (self.stream_stall_seconds > 0, "stream_stall_seconds must be > 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.batch_curve()  # raises ValueError on a bad knob or an unknown curve

    def batch_curve(self) -> BatchCurve | None:
        """The throughput curve, or None: every request at ``tokens_per_second`` whatever the batch."""
        curve = curve_from(
            self.curve,
            BatchCurve(
                tokens_per_second=self.tokens_per_second,
                accept_length=self.accept_length,
                knee=self.batch_knee,
                accept_halving=self.accept_halving_batch,
                graph_max_bs=self.cuda_graph_max_bs_decode,
                eager_slowdown=self.eager_slowdown,
                kv_capacity=self.kv_capacity_tokens,
                reserve_ratio=self.kv_reserve_ratio,
            ),
        )
        knobs = (curve.knee, curve.accept_halving, curve.graph_max_bs, curve.kv_capacity)
        return curve if any(knobs) else None

    @property
    def served_name(self) -> str:
        """The name reported by ``/v1/models`` and used as the metrics label."""
        return self.served_model_name or self.model

    @property
    def has_reasoning_parser(self) -> bool:
        """True when the simulated server was launched with ``--reasoning-parser qwen3``."""
        return self.reasoning_parser != "none"
