"""The live workers and the models their servers serve, read from the workers' heartbeats.

Every worker's heartbeat (``P:worker:W``, see :mod:`dflash_tasks.coord.progress_keys`) carries the
``model`` (served model name) and ``model_path`` its server reported; ``P:workers`` lists the
workers. ``enqueue`` and ``status`` use this to say "no live worker serves model X" instead of
waiting in silence: a job's chunks wait in its model's queue until such a worker is live.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.model_name import serves

#: A worker is alive while its last heartbeat is younger than max(ALIVE_MIN, 4 heartbeats) (s).
ALIVE_MIN = 15.0


def _num(value: object) -> float:
    try:
        x = float(cast(Any, value))
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def alive(worker: Mapping[str, str], now: float) -> bool:
    """Whether a worker's last heartbeat is recent."""
    beat = _num(worker.get("beat_s")) or 2.0
    return now - _num(worker.get("last_seen")) <= max(ALIVE_MIN, 4 * beat)


@dataclass(frozen=True, slots=True)
class FleetWorker:
    """A live worker and what its server serves (empty while the worker does not know it)."""

    name: str
    model: str
    model_path: str
    max_inflight: int = 0  # the requests it keeps in flight (its share of the fleet's capacity)
    tuned: bool = False  # its in-flight tuner moves max_inflight (--max-inflight auto)

    def serves(self, job_model: str) -> bool:
        return serves(job_model, self.model, self.model_path)

    def describe(self) -> str:
        if not self.model and not self.model_path:
            return "unknown (server not answering)"
        if self.model_path and self.model_path != self.model:
            return f"{self.model or '?'} ({self.model_path})"
        return self.model


def live_fleet(beats: Mapping[str, Mapping[str, str]], now: float) -> list[FleetWorker]:
    """The live workers among ``beats`` (worker name -> heartbeat hash)."""
    return [
        FleetWorker(
            name,
            beat.get("model", ""),
            beat.get("model_path", ""),
            int(_num(beat.get("max_inflight"))),
            tuned=bool(beat.get("tuner")),
        )
        for name, beat in sorted(beats.items())
        if beat and alive(beat, now)
    ]


def serving_warning(model: str, fleet: Iterable[FleetWorker]) -> str | None:
    """ "no live worker serves model X ..." when none of ``fleet`` serves ``model``, else None."""
    workers = list(fleet)
    if any(w.serves(model) for w in workers):
        return None
    if not workers:
        return f"no live worker serves model {model!r}: no worker is live"
    served = Counter(w.describe() for w in workers)
    listing = ", ".join(f"{name} ({n} worker{'s' if n != 1 else ''})" for name, n in sorted(served.items()))
    return f"no live worker serves model {model!r}; the live workers serve: {listing}"


def capacity(model: str, fleet: Iterable[FleetWorker]) -> tuple[int, int, int]:
    """(workers, requests in flight, workers whose tuner moves theirs) of the live workers whose
    server serves ``model``."""
    serving = [w for w in fleet if w.serves(model)]
    return len(serving), sum(w.max_inflight for w in serving), sum(w.tuned for w in serving)


def check_serving(bookkeeping: Bookkeeping, model: str, now: float) -> str | None:
    """:func:`serving_warning` for ``model`` over the live workers in Redis."""
    return serving_warning(model, live_fleet(bookkeeping.heartbeats(), now))
