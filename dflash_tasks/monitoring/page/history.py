"""Throughput over time, as the page saw it: one point per progress document it computed."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

#: Points kept (a day at one a minute, or two hours at one every 10 s).
MAX_POINTS = 1440


class ThroughputHistory:
    """The last :data:`MAX_POINTS` (time, tokens/s, samples/s, done) seen; bounded memory."""

    def __init__(self, size: int = MAX_POINTS) -> None:
        self._points: deque[tuple[float, float, float, int]] = deque(maxlen=size)

    def add(self, doc: Mapping[str, Any]) -> None:
        """Record a progress document's last-minute rates (a settled job adds nothing new)."""
        at = float(doc["updated_at"])
        if self._points and at <= self._points[-1][0]:
            return
        rates = doc["rates"]
        self._points.append(
            (at, float(rates["tokens_per_s"]), float(rates["samples_per_s"]), int(doc["samples"]["done"]))
        )

    def tokens_per_s(self) -> list[tuple[float, float]]:
        return [(t, tok) for t, tok, _, _ in self._points]

    def to_list(self) -> list[dict[str, float]]:
        return [
            {"at": t, "tokens_per_s": tok, "samples_per_s": s, "done": d} for t, tok, s, d in self._points
        ]
