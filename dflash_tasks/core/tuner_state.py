"""The in-flight tuner's state as a worker reports it: in its heartbeat (one JSON field), on its
Prometheus endpoint, and in each worker row of the progress document.

One encoding: :meth:`TunerState.to_dict` (its JSON, compact, is :meth:`TunerState.to_json`, the
heartbeat's ``tuner`` field); :meth:`TunerState.from_json` reads that field back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TunerPoint:
    """The measured curve at one target: the latest window's figures (rounded), and how many windows."""

    target: int
    tokens_per_s: float
    accept_length: float
    token_usage: float
    windows: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "tokens_per_s": self.tokens_per_s,
            "accept_length": self.accept_length,
            "token_usage": self.token_usage,
            "windows": self.windows,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> TunerPoint:
        return cls(
            target=_int(doc["target"]),
            tokens_per_s=_float(doc["tokens_per_s"]),
            accept_length=_float(doc["accept_length"]),
            token_usage=_float(doc["token_usage"]),
            windows=_int(doc["windows"]),
        )


@dataclass(frozen=True, slots=True)
class TunerState:
    """Where the tuner is (target, phase, why), its bounds, the curve it measured (by target), its
    current window length (s) and the completion tokens of every sample it heard of."""

    target: int
    phase: str
    reason: str
    floor: int
    ceiling: int
    curve: tuple[TunerPoint, ...]
    window_seconds: float = 0.0
    completed_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "phase": self.phase,
            "reason": self.reason,
            "floor": self.floor,
            "ceiling": self.ceiling,
            "curve": [point.to_dict() for point in self.curve],
            "window_seconds": self.window_seconds,
            "completed_tokens": self.completed_tokens,
        }

    def to_json(self) -> str:
        """The heartbeat's ``tuner`` field."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, field: str) -> TunerState | None:
        """A heartbeat's ``tuner`` field read back; None when empty (a fixed target) or not a state."""
        if not field:
            return None
        try:
            doc = json.loads(field)
            return cls(
                target=_int(doc["target"]),
                phase=_str(doc["phase"]),
                reason=_str(doc["reason"]),
                floor=_int(doc["floor"]),
                ceiling=_int(doc["ceiling"]),
                curve=tuple(TunerPoint.from_dict(point) for point in doc["curve"]),
                window_seconds=_float(doc["window_seconds"]),
                completed_tokens=_int(doc["completed_tokens"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"not an integer: {x!r}")
    return x


def _float(x: Any) -> float:
    """A number as JSON gave it (an int stays an int, so it encodes as it was written)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"not a number: {x!r}")
    return x


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"not a string: {x!r}")
    return x
