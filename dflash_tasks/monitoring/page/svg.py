"""The throughput plot, drawn on the server as an SVG (no script, nothing fetched)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

WIDTH, HEIGHT, PAD = 720, 220, 48


def throughput_svg(points: Sequence[tuple[float, float]], label: str = "tokens/s") -> str:
    """A line plot of ``(unix time, value)`` points, with its axes labelled."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)} over time">'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff" stroke="#ccc"/>'
    )
    if len(points) < 2:
        note = "the plot fills in while the page is open (one point per refresh)"
        return head + f'<text x="{PAD}" y="{HEIGHT // 2}" font-size="13" fill="#666">{note}</text></svg>'
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: float) -> str:
        x = PAD + (t - t0) / span * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - v / top * (HEIGHT - 2 * PAD)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, v) for t, v in points)
    clock = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S") for t in (t0, t1)]
    return (
        head
        + f'<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{line}"/>'
        + f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        + f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        + f'<text x="4" y="{PAD}" font-size="11">{top:,.0f}</text>'
        + f'<text x="4" y="{HEIGHT - PAD}" font-size="11">0</text>'
        + f'<text x="{PAD}" y="{HEIGHT - PAD + 16}" font-size="11">{clock[0]} UTC</text>'
        + f'<text x="{WIDTH - PAD - 70}" y="{HEIGHT - PAD + 16}" font-size="11">{clock[1]} UTC</text>'
        + f'<text x="{WIDTH // 2 - 30}" y="20" font-size="12">{escape(label)}</text></svg>'
    )
