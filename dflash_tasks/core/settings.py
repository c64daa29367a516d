"""Runtime settings: one frozen dataclass per kind of process, built from ``DFLASH_*`` environment
variables and CLI flags by one loader.

This is the only module that reads the environment. Each process loads only its role's class
with ``<Role>.load()`` and passes it down; a function takes the narrowest class it needs.

::

    CommonSettings            every process: Redis, the queue, the lease, S3 (verify, export, report,
    │                         Celery's own configuration in ``celeryconfig.py``)
    └── ProgressSettings      + progress.json refresh and GPU price
        ├── ProducerSettings  enqueue, resume
        ├── MonitorSettings   status, flower, the demo  (+ the Flower password)
        └── WorkerSettings    python -m workers  (+ SGLang requests, flow control, recovery, Prometheus)
            └── NodeSettings  python -m workers.node  (+ GPUs, model, ports, logs)

A field is declared once, on the lowest class whose processes read it, so a setting shared by two
roles has one definition and one default (one exception, tested: the node launcher redeclares
``tune_inflight`` to tune by default). Field ``x`` is read from ``DFLASH_X``; each class checks
its own fields (:meth:`CommonSettings.validate` runs every class's checks, base first).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from dflash_tasks.core.budget import DEFAULT_MAX_TOKENS
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.setting_values import (
    ECHO_LOGS,
    check_at_least,
    check_max_tokens,
    check_names,
    check_on_loop,
    check_positive,
    check_repetition,
    is_user_password,
    parse_value,
    redact_url,
    variables_of,
)

#: Requests a worker keeps in flight against its server: the worker's and the node launcher's
#: default (SGLang resets an unset running-request cap to 48 under speculative decoding).
DEFAULT_MAX_INFLIGHT = 48
#: The tuner's ceiling, and the running-request cap the node launcher gives its servers under
#: ``--max-inflight auto``: far above 48, below where a 27B model's KV cache binds on one B200.
DEFAULT_INFLIGHT_CEILING = 256


@dataclass(frozen=True, slots=True)
class CommonSettings:
    """Every process: the broker and bookkeeping Redis, the queue, the chunk lease, the S3 endpoint.

    Loaded as is by the commands that only need the store or the broker (and by the Celery app
    module, for ``celery`` tools such as Flower); every role below extends it.
    """

    #: The commands (``python -m`` modules) and files that load this very class.
    COMMANDS: ClassVar[tuple[str, ...]] = (
        "dflash_tasks.verify",
        "dflash_tasks.export",
        "dflash_tasks.report",
        "celeryconfig.py",
        "dflash_tasks.coord.celery_app",
    )

    # --- Redis, the queue and the store ---
    #: Celery broker and bookkeeping Redis (one Redis holds both).
    broker_url: str = dataclasses.field(default="redis://127.0.0.1:6379/0", repr=False)
    #: The base queue name: each model's chunks go to ``<queue>.<model key>`` (docs/routing.md).
    queue: str = "dflash"
    #: Key prefix of the bookkeeping keys in Redis (leases, counters, job registry).
    redis_prefix: str = "dflash"
    #: Broker visibility timeout (s): far above the longest chunk, so live chunks are never redelivered.
    visibility_timeout: int = 12 * 3600
    #: A chunk lease lives this long without a heartbeat before the chunk is re-queued (s); every
    #: planner (enqueue, resume, the workers' re-plan) judges unacknowledged deliveries by it.
    lease_seconds: float = 60.0
    #: S3-compatible endpoint for ``s3://`` outputs (MinIO, R2, Ceph); empty: boto3's own
    #: (``AWS_ENDPOINT_URL``, else AWS). Credentials always come from boto3's standard chain.
    s3_endpoint_url: str = ""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Build settings from ``env`` (default: ``os.environ``), then apply non-None ``overrides``.

        Only this class's fields are read. An override this class has no field for raises
        :class:`ConfigError` naming it.
        """
        check_names(cls, overrides)
        values = variables_of(fields(cls), os.environ if env is None else env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def parse(cls, name: str, raw: str) -> Any:
        """Setting ``name``'s value written as ``raw`` (on a flag), parsed as its variable is: a
        flag and its variable accept the same values."""
        kinds = {f.name: f.type for f in fields(cls)}
        return parse_value(name, kinds[name], raw, named=False)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied and validated."""
        check_names(type(self), changes)
        settings = dataclasses.replace(self, **changes)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid field: the base class's checks
        first, then those of each class down to this one (each class checks its own fields)."""
        # Walked by hand: zero-argument super() fails in slots dataclasses before Python 3.14.
        for klass in reversed(type(self).__mro__):
            check = vars(klass).get("_check_own")
            if check is not None:
                check(self)

    def _check_own(self) -> None:
        if not self.queue or any(c in self.queue for c in ", \t\n"):
            raise ConfigError(f"queue must be a name without commas or spaces, got {self.queue!r}")
        check_positive(self, "lease_seconds")
        if self.visibility_timeout <= self.lease_seconds:
            raise ConfigError("visibility_timeout must exceed lease_seconds")
        if not self.broker_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"broker_url must be a redis:// URL, got {redact_url(self.broker_url)!r}")


@dataclass(frozen=True, slots=True)
class ProgressSettings(CommonSettings):
    """Progress and cost: what the processes that write or show a job's progress read.

    A base shared by the producer (``enqueue --wait`` writes progress.json), the workers and
    monitoring (``status``); never loaded on its own.
    """

    COMMANDS: ClassVar[tuple[str, ...]] = ()

    # --- progress.json and cost ---
    #: How often progress.json is refreshed (s); workers also push their live counts every
    #: min(2, progress_seconds) s.
    progress_seconds: float = 5.0
    #: Price of one GPU-hour (USD) for the cost shown by progress.json and status; 0 = unknown.
    gpu_hour_usd: float = 0.0

    def _check_own(self) -> None:
        check_positive(self, "progress_seconds")
        check_at_least(self, 0, "gpu_hour_usd")


@dataclass(frozen=True, slots=True)
class ProducerSettings(ProgressSettings):
    """The producer: staging, queueing, repairing and resuming jobs."""

    COMMANDS: ClassVar[tuple[str, ...]] = ("dflash_tasks.enqueue", "dflash_tasks.resume")

    # --- repair rounds ---
    #: Repair rounds ``enqueue --wait`` runs once every chunk is stored, each regenerating the
    #: samples that failed by a passing cause (a re-run of enqueue queues one more); 0: none.
    repair_rounds: int = 3
    #: Pause before each repair round of ``enqueue --wait`` (s), so that a passing fault has passed.
    repair_spacing_seconds: float = 60.0
    # --- quality ---
    #: A new job's loop detection (``--repetition``, which wins): ``off``, ``on``, or
    #: ``min_chars=N,min_repeats=N,max_period=N`` (docs/quality.md, "Loops"); empty: the defaults.
    repetition: str = ""
    #: What a new job does with a sample stopped in a loop (``--on-loop``, which wins):
    #: ``regenerate``, ``prefix``, ``prefix=N`` or ``drop`` (docs/quality.md, "Loops"); empty: regenerate.
    on_loop: str = ""
    # --- a new job's spec ---
    #: Completion budget of each request of a new job (``--max-tokens``): a number of tokens, or
    #: ``horizon``: each request's budget is the trainer's ``max_length`` less its row's prefix
    #: (docs/quality.md, "The budget").
    max_tokens: int | str = DEFAULT_MAX_TOKENS
    # --- waiting ---
    #: How often ``enqueue --wait`` re-plans the job from the store (s), re-queueing lost chunks.
    wait_replan_seconds: float = 60.0
    #: How long ``enqueue`` waits for the preflight sample to be generated (s).
    preflight_timeout_seconds: float = 3600.0

    def _check_own(self) -> None:
        check_max_tokens(self.max_tokens)
        check_at_least(self, 0, "repair_rounds", "repair_spacing_seconds")
        check_repetition(self.repetition)
        check_on_loop(self.on_loop)
        check_positive(self, "wait_replan_seconds", "preflight_timeout_seconds")


@dataclass(frozen=True, slots=True)
class MonitorSettings(ProgressSettings):
    """Monitoring: the status command, Flower, and the demo (which starts Flower)."""

    COMMANDS: ClassVar[tuple[str, ...]] = (
        "dflash_tasks.status",
        "dflash_tasks.flower",
        "dflash_tasks.page",
        "dflash_tasks.demo",
    )

    # --- Flower ---
    #: Password of ``python -m dflash_tasks.flower`` (user ``admin``); empty: one is generated.
    flower_password: str = dataclasses.field(default="", repr=False)
    #: Tasks Flower keeps in memory.
    flower_max_tasks: int = 20_000
    #: Flower forgets a worker offline this long (s).
    flower_purge_offline_seconds: int = 600

    # --- the job's page ---
    #: ``user:password`` of ``python -m dflash_tasks.page`` (HTTP basic auth); empty: user
    #: ``admin`` and a password generated and printed at start.
    page_basic_auth: str = dataclasses.field(default="", repr=False)
    #: How often the job's page computes the progress for its throughput plot (s).
    page_refresh_seconds: float = 10.0

    def _check_own(self) -> None:
        check_positive(self, "flower_max_tasks", "flower_purge_offline_seconds", "page_refresh_seconds")
        if self.page_basic_auth and not is_user_password(self.page_basic_auth):
            raise ConfigError("page_basic_auth must be 'user:password', both non-empty")


@dataclass(frozen=True, slots=True)
class WorkerSettings(ProgressSettings):
    """A worker: its SGLang server, requests, flow control, recovery loops and Prometheus endpoint."""

    COMMANDS: ClassVar[tuple[str, ...]] = ("workers",)

    # --- recovery ---
    #: How often a worker renews the leases of the chunks it runs (s).
    heartbeat_seconds: float = 10.0
    #: How often live workers look for chunks whose lease expired (s).
    reconcile_seconds: float = 15.0
    #: How often one live worker re-plans every job from the store, the backstop for lost messages (s).
    replan_seconds: float = 300.0
    # --- the SGLang server and requests to it ---
    #: The SGLang endpoint this worker is bound to (``--endpoint``).
    endpoint: str = ""
    #: Bearer token for SGLang servers started with ``--api-key`` (never logged).
    sglang_api_key: str = dataclasses.field(default="", repr=False)
    #: Client timeout of one generation request (s). Thinking outputs are long: be generous. A
    #: streamed request (loop detection on) bounds the silence between two pieces of its answer
    #: instead ([sglang](sglang.md#streaming)).
    request_timeout: float = 1800.0
    #: Attempts per sample for retryable failures (connection errors, timeouts, 5xx, 503).
    request_attempts: int = 6
    #: First backoff delay (s); doubles per attempt, with full jitter, up to ``retry_backoff_max``.
    #: Also paces the retries of a chunk's store write (``store_retry_seconds``).
    retry_backoff: float = 1.0
    #: Longest backoff delay between two attempts of one sample (s).
    retry_backoff_max: float = 60.0
    #: How often a worker whose server is down polls its health endpoint (s).
    health_poll_seconds: float = 5.0
    #: How often a worker re-reads which model its server serves (s); also read at start and
    #: whenever the server recovers. A changed model moves the worker to that model's queue.
    identity_seconds: float = 30.0
    #: Delay before a chunk that failed on store or Redis trouble runs again (s); doubles per
    #: failure of that chunk, up to 10 minutes.
    requeue_backoff: float = 30.0
    #: How long a worker retries storing a generated chunk, and then recording it as done, on
    #: transient trouble (a full disk, S3 5xx or unreachable, Redis down) before it gives up and
    #: re-queues the chunk (s); the chunk's lease is kept meanwhile. 0: no retries.
    store_retry_seconds: float = 300.0
    # --- flow control ---
    #: Requests this worker keeps in flight against its server (SGLang's spec-decoding cap is 48).
    #: As for ``--max-inflight``: ``auto`` turns ``tune_inflight`` on, a number pins the target,
    #: unless ``DFLASH_TUNE_INFLIGHT`` is set too (then the tuner starts from it).
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    #: Tune the in-flight target from the server's own numbers (``--max-inflight auto``), between
    #: ``inflight_floor`` and ``inflight_ceiling`` (docs/performance.md).
    tune_inflight: bool = False
    #: The tuner's lowest target.
    inflight_floor: int = 8
    #: The tuner's highest target: the server's ``--max-running-requests`` (the node launcher starts
    #: its servers with it, and with ``--cuda-graph-max-bs-decode`` as large).
    inflight_ceiling: int = DEFAULT_INFLIGHT_CEILING
    #: The tuner's shortest measuring window (s); it lengthens a window to one request's lifetime.
    tune_window_seconds: float = 30.0
    #: How often the tuner's gauges are read from the server's /metrics within a window (s).
    tune_sample_seconds: float = 2.0
    #: Most chunks a worker holds at once. It takes the next chunk whenever fewer than
    #: ``backlog_low_water`` requests wait for a slot, so slots never idle at chunk boundaries.
    max_chunks: int = 8
    #: Backlog (requests waiting for a slot) below which a worker takes another chunk; 0 = max_inflight/2.
    backlog_low_water: int = 0
    # --- identity, logs and Prometheus ---
    #: Worker name shown in Flower and recorded on each sample.
    worker_name: str = ""
    #: Log level of workers.
    log_level: str = "INFO"
    #: Prometheus port (``--metrics-port``); 0 disables it. One port per worker on a machine.
    metrics_port: int = 9808
    #: Address the Prometheus endpoint binds to (loopback unless a scraper needs more).
    metrics_address: str = "127.0.0.1"

    def _check_own(self) -> None:
        check_at_least(self, 1, "max_inflight", "max_chunks", "request_attempts")
        if not 1 <= self.inflight_floor <= self.inflight_ceiling:
            raise ConfigError(
                f"inflight_floor ({self.inflight_floor}) must be in "
                f"1..inflight_ceiling ({self.inflight_ceiling})"
            )
        if self.heartbeat_seconds <= 0 or self.lease_seconds <= self.heartbeat_seconds:
            raise ConfigError(
                f"lease_seconds ({self.lease_seconds}) must exceed "
                f"heartbeat_seconds ({self.heartbeat_seconds})"
            )
        check_positive(self, "tune_window_seconds", "tune_sample_seconds", "request_timeout")
        check_positive(self, "reconcile_seconds", "replan_seconds", "health_poll_seconds", "identity_seconds")
        check_at_least(
            self, 0, "retry_backoff", "retry_backoff_max", "requeue_backoff", "store_retry_seconds"
        )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0 (off) or a TCP port, got {self.metrics_port}")

    def low_water(self, target: int | None = None) -> int:
        """The backlog below which a worker takes another chunk (half the in-flight ``target``)."""
        if self.backlog_low_water > 0:
            return self.backlog_low_water
        return max(1, (self.max_inflight if target is None else target) // 2)

    def pool_ceiling(self) -> int:
        """The most requests the worker may ever have in flight: the fixed target, or the tuner's ceiling."""
        return max(self.inflight_ceiling, self.max_inflight) if self.tune_inflight else self.max_inflight


@dataclass(frozen=True, slots=True)
class NodeSettings(WorkerSettings):
    """The node launcher: one SGLang server and one worker per GPU.

    It reads the worker settings too (its workers inherit its environment), so a bad one fails
    once here rather than in every worker's log.
    """

    COMMANDS: ClassVar[tuple[str, ...]] = ("workers.node",)

    # --- the node ---
    #: GPUs this node serves, e.g. ``0-6`` or ``0,2,5`` (``--gpus``).
    gpus: str = ""
    #: Model directory (or HF id) each SGLang server loads (``--model``).
    model_path: str = ""
    #: GPU ``N`` gets its SGLang server on port ``port_base + N`` (``--port-base``).
    port_base: int = 30000
    #: Folder of the node's per-GPU server and worker logs (``--log-dir``).
    log_dir: str = "logs"
    #: Extra SGLang flags, shell-quoted, appended to every server's command line (``--sglang-arg``).
    sglang_args: str = ""
    # --- worker settings whose default differs here ---
    #: The launcher tunes each GPU's in-flight target unless a number pins it (docs/performance.md).
    tune_inflight: bool = True
    #: Interpreter with sglang installed that runs the servers (``--sglang-python``); empty: the node's.
    sglang_python: str = ""
    #: An EAGLE3 draft model for every server, for a model without MTP layers (``--draft-model``).
    draft_model: str = ""
    #: Which logs the node copies to its stdout, prefixed: ``all``, ``workers`` or ``none`` (``--echo``).
    echo_logs: str = "all"
    #: The node's Prometheus targets (servers and workers) go to this file_sd JSON file; empty:
    #: ``<log_dir>/prometheus-targets.json``; ``none``: not written (``--scrape-targets``).
    scrape_targets: str = ""
    #: Host Prometheus reaches the targets at; empty: ``metrics_address``, or this machine's name
    #: when that is ``0.0.0.0`` (``--scrape-host``).
    scrape_host: str = ""
    # --- the node's supervisor ---
    #: Time between health probes of a server (s); 1 s at most while a server starts.
    health_interval_seconds: float = 5.0
    #: A server not healthy this long after it started is killed and restarted (s).
    server_start_timeout_seconds: float = 1800.0
    #: A server unhealthy this long is killed and restarted (s).
    hang_restart_seconds: float = 600.0
    #: On stop, how long running chunks get to finish before the workers are killed (s).
    worker_stop_timeout_seconds: float = 600.0
    #: On stop, time from a server's SIGTERM to its SIGKILL (s).
    server_stop_timeout_seconds: float = 60.0
    #: First delay before a dead server or worker is restarted (s); doubles per failure in a row,
    #: up to 60 s (or this delay, if longer).
    restart_delay_seconds: float = 1.0
    #: Failures in a row after which a GPU is given up.
    max_failures: int = 5

    def _check_own(self) -> None:
        if not 1 <= self.port_base <= 65535:
            raise ConfigError(f"port_base must be a TCP port (1-65535), got {self.port_base}")
        if self.echo_logs not in ECHO_LOGS:
            raise ConfigError(f"echo_logs must be one of {', '.join(ECHO_LOGS)}, got {self.echo_logs!r}")
        check_at_least(self, 1, "max_failures")
        check_at_least(self, 0, "restart_delay_seconds")
        check_positive(
            self, "health_interval_seconds", "server_start_timeout_seconds", "hang_restart_seconds"
        )
        check_positive(self, "worker_stop_timeout_seconds", "server_stop_timeout_seconds")


#: The classes a process loads, one per kind of process (``ProgressSettings`` is only a base).
ROLES: tuple[type[CommonSettings], ...] = (
    CommonSettings,
    ProducerSettings,
    MonitorSettings,
    WorkerSettings,
    NodeSettings,
)
