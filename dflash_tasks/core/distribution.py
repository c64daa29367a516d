"""Summaries of token-count distributions (the preflight, the report)."""

from __future__ import annotations

import statistics


def describe(values: list[int]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "p10": 0, "p50": 0, "p90": 0, "max": 0}
    ordered = sorted(values)

    def pct(p: float) -> int:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {
        "count": len(ordered),
        "mean": round(statistics.fmean(ordered), 1),
        "p10": pct(0.1),
        "p50": pct(0.5),
        "p90": pct(0.9),
        "max": ordered[-1],
    }


def describe_floats(values: list[float], digits: int = 3) -> dict[str, float]:
    """Like :func:`describe` for real values (e.g. per-sample accept lengths), rounded to ``digits``."""
    if not values:
        return {
            "count": 0,
            "mean": 0.0,
            "min": 0.0,
            "p10": 0.0,
            "p25": 0.0,
            "p50": 0.0,
            "p90": 0.0,
            "max": 0.0,
        }
    ordered = sorted(values)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], digits)

    return {
        "count": len(ordered),
        "mean": round(statistics.fmean(ordered), digits),
        "min": round(ordered[0], digits),
        "p10": pct(0.1),
        "p25": pct(0.25),
        "p50": pct(0.5),
        "p90": pct(0.9),
        "max": round(ordered[-1], digits),
    }
