"""Runtime settings: one frozen dataclass built from ``DFLASH_*`` environment variables and CLI flags.

This is the only module that reads the environment. Every process (enqueue, workers, verify,
Celery's own configuration in ``celeryconfig.py``) builds a :class:`Settings` with
:meth:`Settings.load` and passes it down.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dflash_tasks.core.errors import ConfigError

ENV_PREFIX = "DFLASH_"


@dataclass(frozen=True, slots=True)
class Settings:
    """Process settings. Field ``x`` is read from ``DFLASH_X``; CLI flags override both."""

    # --- Redis, the queue and recovery (every process) ---
    #: Celery broker and bookkeeping Redis (one Redis holds both).
    broker_url: str = dataclasses.field(default="redis://127.0.0.1:6379/0", repr=False)
    #: The base queue name: each model's chunks go to ``<queue>.<model key>`` (docs/routing.md).
    queue: str = "dflash"
    #: Key prefix of the bookkeeping keys in Redis (leases, counters, job registry).
    redis_prefix: str = "dflash"
    #: Broker visibility timeout (s): far above the longest chunk, so live chunks are never redelivered.
    visibility_timeout: int = 12 * 3600
    #: A chunk lease lives this long without a heartbeat before the chunk is re-queued (s).
    lease_seconds: float = 60.0
    #: How often a worker renews the leases of the chunks it runs (s).
    heartbeat_seconds: float = 10.0
    #: How often live workers look for chunks whose lease expired (s).
    reconcile_seconds: float = 15.0
    #: How often one live worker re-plans every job from the store, the backstop for lost messages (s).
    replan_seconds: float = 300.0
    # --- workers: requests to SGLang ---
    #: Client timeout of one generation request (s). Thinking outputs are long: be generous.
    request_timeout: float = 1800.0
    #: Attempts per sample for retryable failures (connection errors, timeouts, 5xx, 503).
    request_attempts: int = 6
    #: First backoff delay (s); doubles per attempt, with full jitter, up to ``retry_backoff_max``.
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
    # --- endpoints: the SGLang server (workers) and S3 (every process) ---
    #: The SGLang endpoint this worker is bound to (workers only).
    endpoint: str = ""
    #: Bearer token for SGLang servers started with ``--api-key`` (never logged).
    sglang_api_key: str = dataclasses.field(default="", repr=False)
    #: S3-compatible endpoint for ``s3://`` outputs (MinIO, R2, Ceph); empty: boto3's own
    #: (``AWS_ENDPOINT_URL``, else AWS). Credentials always come from boto3's standard chain.
    s3_endpoint_url: str = ""
    # --- workers: flow control ---
    #: Requests this worker keeps in flight against its server (SGLang's spec-decoding cap is 48).
    max_inflight: int = 48
    #: Most chunks a worker holds at once. It takes the next chunk whenever fewer than
    #: ``backlog_low_water`` requests wait for a slot, so slots never idle at chunk boundaries.
    max_chunks: int = 8
    #: Backlog (requests waiting for a slot) below which a worker takes another chunk; 0 = max_inflight/2.
    backlog_low_water: int = 0
    #: Worker name shown in Flower and recorded on each sample.
    worker_name: str = ""
    #: Log level of workers.
    log_level: str = "INFO"
    # --- the node launcher (python -m workers.node) ---
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
    # --- monitoring (progress.json, status, Prometheus, Flower) ---
    #: How often progress.json is refreshed (s); workers also push their live counts every
    #: min(2, progress_seconds) s.
    progress_seconds: float = 5.0
    #: Worker: Prometheus port (``--metrics-port``); 0 disables it. One port per worker on a machine.
    metrics_port: int = 9808
    #: Worker: address the Prometheus endpoint binds to (loopback unless a scraper needs more).
    metrics_address: str = "127.0.0.1"
    #: Price of one GPU-hour (USD) for the cost shown by progress.json and status; 0 = unknown.
    gpu_hour_usd: float = 0.0
    #: Password of ``python -m dflash_tasks.flower`` (user ``admin``); empty: one is generated.
    flower_password: str = dataclasses.field(default="", repr=False)

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``env`` (default: ``os.environ``), then apply non-None ``overrides``."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = source.get(ENV_PREFIX + field.name.upper())
            if raw is not None and raw != "":
                values[field.name] = _coerce(field.name, field.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid field."""
        if self.max_inflight < 1:
            raise ConfigError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.max_chunks < 1:
            raise ConfigError(f"max_chunks must be >= 1, got {self.max_chunks}")
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
        if not self.queue or any(c in self.queue for c in ", \t\n"):
            raise ConfigError(f"queue must be a name without commas or spaces, got {self.queue!r}")
        if self.visibility_timeout <= self.lease_seconds:
            raise ConfigError("visibility_timeout must exceed lease_seconds")
        if not 1 <= self.port_base <= 65535:
            raise ConfigError(f"port_base must be a TCP port (1-65535), got {self.port_base}")
        if not self.progress_seconds > 0:
            raise ConfigError(f"progress_seconds must be > 0, got {self.progress_seconds}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0 (off) or a TCP port, got {self.metrics_port}")
        if not self.gpu_hour_usd >= 0:
            raise ConfigError(f"gpu_hour_usd must be >= 0, got {self.gpu_hour_usd}")
        if not self.broker_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"broker_url must be a redis:// URL, got {redact_url(self.broker_url)!r}")

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        settings = dataclasses.replace(self, **changes)
        settings.validate()
        return settings

    def low_water(self) -> int:
        """The backlog below which a worker takes another chunk."""
        return self.backlog_low_water if self.backlog_low_water > 0 else max(1, self.max_inflight // 2)


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
