"""The progress document, typed: one dataclass per section, and its one encoding.

:meth:`ProgressDocument.to_dict` is the only place the document becomes JSON-ready: its keys, in
their order, are ``progress.json``'s (written indented by
:mod:`~dflash_tasks.monitoring.progress_writer`) and ``status --json``'s (one line):
:meth:`ProgressDocument.to_json`. :mod:`~dflash_tasks.monitoring.progress` fills it from a snapshot;
:mod:`~dflash_tasks.monitoring.status_view` reads its fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dflash_tasks.core.states import JobState
from dflash_tasks.core.tuner_state import TunerState

#: The ``version`` of the progress document.
FORMAT_VERSION = 1


def _flat(section: Any) -> dict[str, Any]:
    """A section of plain fields as a dict, in field order."""
    return {f.name: getattr(section, f.name) for f in fields(section)}


@dataclass(frozen=True, slots=True)
class Header:
    """The job, its state, who wrote the document when, and the job's start, end and duration."""

    job_id: str
    output: str
    model: str
    state: JobState
    pause_reason: str | None
    updated_at: float
    updated_at_iso: str
    writer: str
    started_at: float | None
    finished_at: float | None
    elapsed_s: float | None
    version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, **{k: v for k, v in _flat(self).items() if k != "version"}}


@dataclass(frozen=True, slots=True)
class SamplesSection:
    total: int
    done: int
    ok: int
    failed: int  # the current records: a repaired sample counts as ok
    repaired: int
    remaining: int
    invalid_lines: int


@dataclass(frozen=True, slots=True)
class TurnsSection:
    total: int
    done: int
    remaining: int
    generated: int | None


@dataclass(frozen=True, slots=True)
class ChunksSection:
    total: int
    done: int
    running: int
    pending: int


@dataclass(frozen=True, slots=True)
class TokensSection:
    generated: int
    prompt: int
    avg_per_sample: float | None
    counted_samples: int


@dataclass(frozen=True, slots=True)
class RateFigures:
    samples_per_s: float
    turns_per_s: float
    tokens_per_s: float


@dataclass(frozen=True, slots=True)
class RatesSection:
    """Rates over the last ``window_s`` seconds, and since the start."""

    window_s: int
    samples_per_s: float
    turns_per_s: float
    tokens_per_s: float
    since_start: RateFigures

    def to_dict(self) -> dict[str, Any]:
        return {**_flat(self), "since_start": _flat(self.since_start)}


@dataclass(frozen=True, slots=True)
class Eta:
    """When the job will be done (the document's top-level ``eta_*`` fields)."""

    eta_s: float | None
    eta_at_iso: str | None
    eta_basis: str | None  # last_minute or since_start
    eta_unit: str  # turns or samples
    eta_by_tokens_s: float | None


@dataclass(frozen=True, slots=True)
class CostSection:
    gpu_hour_usd: float | None
    gpus: int
    gpu_hours: float
    usd: float | None
    projected_total_usd: float | None


@dataclass(frozen=True, slots=True)
class SpecSection:
    """The job's speculative-decoding accept length, and where it comes from."""

    accept_length: float | None
    source: str | None
    job: float | None
    window: float | None
    tokens: int
    verify_passes: int
    server_lifetime: float | None


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """What one worker did for the job, and its state now."""

    name: str
    endpoint: str
    alive: bool
    last_seen_s: float | None
    healthy: bool | None
    samples: int
    failed: int
    tokens: int
    chunks: int
    samples_per_s: float
    tokens_per_s: float
    inflight: int
    waiting: int
    max_inflight: int
    held_chunks: int
    spec_accept_length: float | None
    spec_accept_source: str | None
    spec_accept_length_window: float | None
    server_accept_length: float | None
    tuner: TunerState | None

    def to_dict(self) -> dict[str, Any]:
        return {**_flat(self), "tuner": None if self.tuner is None else self.tuner.to_dict()}


@dataclass(frozen=True, slots=True)
class ProgressDocument:
    """The content of ``progress.json`` (and of ``status --json``)."""

    header: Header
    samples: SamplesSection
    turns: TurnsSection
    chunks: ChunksSection
    queue: str | None
    queue_depth: int | None
    tokens: TokensSection
    rates: RatesSection
    eta: Eta
    cost: CostSection
    trainable_tokens: Mapping[str, Any] | None  # trainable.json's figures (core.trainable)
    yield_section: Mapping[str, Any] | None  # monitoring.live_yield
    sources: Mapping[str, Any] | None  # core.source_quality
    spec: SpecSection
    workers: tuple[WorkerRow, ...]
    counters: Mapping[str, float]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The one encoding: JSON-ready, keys in the document's order."""
        return {
            **self.header.to_dict(),
            "samples": _flat(self.samples),
            "turns": _flat(self.turns),
            "chunks": _flat(self.chunks),
            "queue": self.queue,
            "queue_depth": self.queue_depth,
            "tokens": _flat(self.tokens),
            "rates": self.rates.to_dict(),
            **_flat(self.eta),
            "cost": _flat(self.cost),
            "trainable_tokens": None if self.trainable_tokens is None else dict(self.trainable_tokens),
            "yield": None if self.yield_section is None else dict(self.yield_section),
            "sources": None if self.sources is None else dict(self.sources),
            "spec_accept_length": self.spec.accept_length,
            "spec": _flat(self.spec),
            "workers": [w.to_dict() for w in self.workers],
            "counters": dict(self.counters),
            "warnings": list(self.warnings),
        }

    def to_json(self, indent: int | None = None) -> str:
        """``progress.json`` (``indent=1``) or ``status --json`` (one line)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)
