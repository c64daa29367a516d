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
roles has one definition and one default. Field ``x`` is read from ``DFLASH_X``; each class checks
its own fields (:meth:`CommonSettings.validate` runs every class's checks, base first).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from dflash_tasks.core.budget import DEFAULT_MAX_TOKENS, parse_max_tokens
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.repetition import RepetitionSettings

ENV_PREFIX = "DFLASH_"
#: Requests a worker keeps in flight against its server: the worker's and the node launcher's
#: default (SGLang resets an unset running-request cap to 48 under speculative decoding).
DEFAULT_MAX_INFLIGHT = 48
#: The tuner's ceiling, and the running-request cap the node launcher gives its servers under
#: ``--max-inflight auto``: far above 48, below where a 27B model's KV cache binds on one B200.
DEFAULT_INFLIGHT_CEILING = 256


def _is_user_password(value: str) -> bool:
    user, sep, password = value.partition(":")
    return bool(user and sep and password)


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
        _check_names(cls, overrides)
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        tune = False
        for field in fields(cls):
            raw = source.get(ENV_PREFIX + field.name.upper())
            if raw is None or raw == "":
                continue
            if field.name == "max_inflight" and raw.strip().lower() == AUTO_INFLIGHT:
                tune = True  # DFLASH_MAX_INFLIGHT=auto means what --max-inflight auto means
                continue
            if field.name == "max_tokens":  # a number or "horizon", as --max-tokens takes
                values[field.name] = _max_tokens(raw)
                continue
            values[field.name] = _coerce(field.name, field.type, raw)
        if tune:
            values.update(inflight_overrides(AUTO_INFLIGHT))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied and validated."""
        _check_names(type(self), changes)
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
        if not self.lease_seconds > 0:
            raise ConfigError(f"lease_seconds must be > 0, got {self.lease_seconds}")
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
        if not self.progress_seconds > 0:
            raise ConfigError(f"progress_seconds must be > 0, got {self.progress_seconds}")
        if not self.gpu_hour_usd >= 0:
            raise ConfigError(f"gpu_hour_usd must be >= 0, got {self.gpu_hour_usd}")


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

    # --- a new job's spec ---
    #: Completion budget of each request of a new job (``--max-tokens``): a number of tokens, or
    #: ``horizon``: each request's budget is the trainer's ``max_length`` less its row's prefix
    #: (docs/quality.md, "The budget").
    max_tokens: int | str = DEFAULT_MAX_TOKENS

    def _check_own(self) -> None:
        try:
            parsed = parse_max_tokens(self.max_tokens)
        except ConfigError as exc:
            raise ConfigError(f"max_tokens: {exc}") from None
        if parsed != self.max_tokens:
            raise ConfigError(f"max_tokens must be an int or {parsed!r}, got {self.max_tokens!r}")
        if self.repair_rounds < 0:
            raise ConfigError(f"repair_rounds must be >= 0, got {self.repair_rounds}")
        if not self.repair_spacing_seconds >= 0:
            raise ConfigError(f"repair_spacing_seconds must be >= 0, got {self.repair_spacing_seconds}")
        try:
            RepetitionSettings.parse(self.repetition)
        except ValueError as exc:
            raise ConfigError(f"{ENV_PREFIX}REPETITION={self.repetition!r}: {exc}") from None


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

    # --- the job's page ---
    #: ``user:password`` of ``python -m dflash_tasks.page`` (HTTP basic auth); empty: user
    #: ``admin`` and a password generated and printed at start.
    page_basic_auth: str = dataclasses.field(default="", repr=False)

    def _check_own(self) -> None:
        if self.page_basic_auth and not _is_user_password(self.page_basic_auth):
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
    #: Client timeout of one generation request (s). Thinking outputs are long: be generous.
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
    #: Requests this worker keeps in flight against its server (SGLang's spec-decoding cap is 48);
    #: with ``tune_inflight``, where the tuner starts. ``auto``, as for ``--max-inflight``, turns
    #: ``tune_inflight`` on and starts from the default.
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
        if self.max_inflight < 1:
            raise ConfigError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.max_chunks < 1:
            raise ConfigError(f"max_chunks must be >= 1, got {self.max_chunks}")
        if not 1 <= self.inflight_floor <= self.inflight_ceiling:
            raise ConfigError(
                f"inflight_floor ({self.inflight_floor}) must be in "
                f"1..inflight_ceiling ({self.inflight_ceiling})"
            )
        if not (self.tune_window_seconds > 0 and self.tune_sample_seconds > 0):
            raise ConfigError("tune_window_seconds and tune_sample_seconds must be > 0")
        if self.request_attempts < 1:
            raise ConfigError(f"request_attempts must be >= 1, got {self.request_attempts}")
        if self.heartbeat_seconds <= 0 or self.lease_seconds <= self.heartbeat_seconds:
            raise ConfigError(
                f"lease_seconds ({self.lease_seconds}) must exceed "
                f"heartbeat_seconds ({self.heartbeat_seconds})"
            )
        positive = ("request_timeout", "reconcile_seconds", "replan_seconds", "health_poll_seconds")
        for name in (*positive, "identity_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not (self.retry_backoff >= 0 and self.retry_backoff_max >= 0):
            raise ConfigError("retry_backoff and retry_backoff_max must be >= 0")
        if not self.requeue_backoff >= 0:
            raise ConfigError(f"requeue_backoff must be >= 0, got {self.requeue_backoff}")
        if not self.store_retry_seconds >= 0:
            raise ConfigError(f"store_retry_seconds must be >= 0, got {self.store_retry_seconds}")
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

    def _check_own(self) -> None:
        if not 1 <= self.port_base <= 65535:
            raise ConfigError(f"port_base must be a TCP port (1-65535), got {self.port_base}")


#: The classes a process loads, one per kind of process (``ProgressSettings`` is only a base).
ROLES: tuple[type[CommonSettings], ...] = (
    CommonSettings,
    ProducerSettings,
    MonitorSettings,
    WorkerSettings,
    NodeSettings,
)


def _check_names(cls: type[CommonSettings], given: Mapping[str, Any]) -> None:
    known = {f.name for f in fields(cls)}
    unknown = [name for name in given if name not in known]
    if unknown:
        raise ConfigError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}")


def _coerce(name: str, kind: Any, raw: str) -> Any:
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "float":
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(raw)
            return value
        if kind_name == "bool":
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind_name}") from None
    return raw


def _max_tokens(raw: str) -> int | str:
    try:
        return parse_max_tokens(raw)
    except ConfigError as exc:
        raise ConfigError(f"{ENV_PREFIX}MAX_TOKENS={raw!r}: {exc}") from None


#: ``--max-inflight auto``: the worker tunes its target (``tune_inflight``).
AUTO_INFLIGHT = "auto"


def parse_inflight(text: str) -> int | str:
    """A ``--max-inflight`` value: a number of requests, or ``auto``; raises ``ValueError`` otherwise
    (argparse shows its message)."""
    if text.strip().lower() == AUTO_INFLIGHT:
        return AUTO_INFLIGHT
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected a number of requests or {AUTO_INFLIGHT!r}, got {text!r}") from None


def inflight_overrides(value: int | str | None) -> dict[str, Any]:
    """The settings a ``--max-inflight`` value sets: a number pins the target (whatever
    ``DFLASH_TUNE_INFLIGHT`` says), ``auto`` turns the tuner on, None leaves both to the environment."""
    if value is None:
        return {}
    if value == AUTO_INFLIGHT:
        return {"tune_inflight": True}
    return {"max_inflight": value, "tune_inflight": False}


def redact_url(url: str) -> str:
    """``url`` with any password (userinfo or ``?password=``) replaced by ``***``, for logs and messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        rest = f"{user}:***@{host}" if ":" in creds else f"{creds}@{host}"
    rest = _QUERY_PASSWORD.sub(r"\1***", rest)
    return f"{scheme}://{rest}" if sep else rest


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)
