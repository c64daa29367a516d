"""Views of a progress document (``progress.json``'s format): plain text and a live rich table.

Both are plain functions of the document and show the same figures: :func:`render` is the text
that ``status`` prints once, or repeatedly when its output is not a terminal; :func:`render_table`
is what ``status --watch`` redraws in place on a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group, JustifyMethod, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dflash_tasks.core.on_loop import loop_figures
from dflash_tasks.core.spec_stats import SOURCE_PER_REQUEST, SOURCE_SERVER
from dflash_tasks.core.states import JobState
from dflash_tasks.core.trainable import describe_trainable
from dflash_tasks.core.tuner_state import TunerState
from dflash_tasks.monitoring.live_yield import describe_yield
from dflash_tasks.monitoring.progress_bar import format_duration
from dflash_tasks.monitoring.progress_document import (
    CostSection,
    Eta,
    ProgressDocument,
    SpecSection,
    WorkerRow,
)

#: The workers table's columns, and which of them are right-aligned (the numbers).
WORKER_HEADER = (
    "WORKER",
    "ENDPOINT",
    "STATE",
    "SAMPLES/S",
    "TOK/S",
    "SAMPLES",
    "FAILED",
    "IN FLIGHT",
    "HELD",
    "ACCEPT",
    "ACCEPT 1M",
    "SEEN",
)
WORKER_RIGHT = frozenset({3, 4, 5, 6, 7, 8, 9, 10})
SERVER_AVERAGE_NOTE = "* the server's lifetime average: its samples report no per-request stats"

_STATE_STYLE = {"running": "green", "done": "bold blue", "paused": "bold yellow", "preflight": "cyan"}
_WORKER_STYLE = {"up": "green", "DOWN": "bold red", "gone": "dim"}


# --- the figures, shared by both views ----------------------------------------------------------


def _n(x: float | int | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def done_fraction(done: int, total: int) -> float:
    """Samples done over samples in all (1.0 for an empty job)."""
    return done / total if total else 1.0


def job_state(doc: ProgressDocument) -> str:
    """The job's state, with the reason of a pause."""
    h = doc.header
    return f"{h.state}" + (f" ({h.pause_reason})" if h.pause_reason else "")


def job_line(doc: ProgressDocument) -> str:
    """``job <id>  <state>``."""
    return f"job {doc.header.job_id}  {job_state(doc)}"


def where_line(doc: ProgressDocument) -> str:
    """The model, the output and when the document was computed."""
    h = doc.header
    return f"{h.model}  ->  {h.output}   (at {datetime.fromtimestamp(h.updated_at).strftime('%H:%M:%S')})"


def done_line(doc: ProgressDocument) -> str:
    """``1,436 / 1,500 samples``."""
    return f"{doc.samples.done:,} / {doc.samples.total:,} samples"


def summary_rows(doc: ProgressDocument) -> list[tuple[str, str]]:
    """The summary as (label, figures) rows: samples, turns, chunks, rate, ETA, tokens, spec, cost."""
    s, c, t, r = doc.samples, doc.chunks, doc.tokens, doc.rates
    by_turns = doc.eta.eta_unit == "turns"
    repaired = f", {s.repaired:,} repaired" if s.repaired else ""
    rows = [
        (
            "samples",
            f"{s.done:,} done ({s.failed:,} failed{repaired}) | {s.remaining:,} left"
            f" | {s.invalid_lines:,} invalid input lines",
        )
    ]
    if by_turns:
        turns = doc.turns
        generated = f" | {turns.generated:,} generated" if turns.generated else ""
        rows.append(
            (
                "turns",
                f"{turns.done:,} / {turns.total:,} done{generated}"
                f" | {turns.remaining:,} left (a conversation costs one generation per turn)",
            )
        )
    queue = f" | queue depth {doc.queue_depth:,} ({doc.queue or '?'})" if doc.queue_depth is not None else ""
    rows.append(("chunks", f"{c.done:,} done | {c.running:,} running | {c.pending:,} pending{queue}"))
    rows.append(
        (
            "rate",
            f"last {r.window_s}s: {r.samples_per_s:,.2f} samples/s"
            + (f"  {r.turns_per_s:,.2f} turns/s" if by_turns else "")
            + f"  {r.tokens_per_s:,.0f} tok/s"
            f"  | since start: {r.since_start.samples_per_s:,.2f} samples/s"
            f"  {r.since_start.tokens_per_s:,.0f} tok/s",
        )
    )
    if doc.header.state == JobState.DONE:
        rows.append(("finished", f"in {format_duration(doc.header.elapsed_s)}"))
    else:
        rows.append(("ETA", _eta(doc.eta)))
        rows.append(("elapsed", format_duration(doc.header.elapsed_s)))
    rows.append(("tokens", f"{t.generated:,} generated | {_n(t.avg_per_sample)} per sample"))
    if doc.trainable_tokens:
        rows.append(("trainable", describe_trainable(doc.trainable_tokens)))
    if doc.yield_section:
        rows.append(("yield", describe_yield(doc.yield_section, c.done)))
    loops = loop_figures(doc.counters)
    if loops:
        rows.append(("loops", describe_loops(loops, s.done)))
    spec_line = render_spec(doc.spec)
    if spec_line:
        rows.append(("spec", spec_line))
    rows.append(("cost", _cost(doc.header.state, doc.cost)))
    for name, figures in (doc.sources or {}).items():
        rows.append((f"source {name}", _source_line(figures)))
    return rows


def describe_loops(loops: dict[str, int], done: int) -> str:
    """Samples stopped in a loop (their share of those done), generations, and the tokens saved."""
    share = f" ({loops['samples'] / done:.1%})" if done else ""
    return (
        f"{loops['samples']:,} samples stopped in a loop{share} | {loops['generations']:,} generations "
        f"stopped, repairs included | {loops['tokens_saved']:,} tokens of budget saved"
    )


def _source_line(s: dict[str, Any]) -> str:
    """A source's staged samples, and what the latest report counted of it."""
    line = f"{s.get('staged_samples') or 0:,} samples staged, {s.get('invalid') or 0:,} invalid"
    if "ok" in s:
        line += f" | report: {s['ok']:,} ok, {s['failed']:,} failed, {s['truncated_share']:.1%} truncated"
        line += f", cost share {s['cost_share']:.1%}" + (f" (${s['usd']:,.2f})" if s.get("usd") else "")
    return line


def _eta(eta: Eta) -> str:
    basis = {"last_minute": "last-minute", "since_start": "since-start"}.get(eta.eta_basis or "", "")
    text = format_duration(eta.eta_s)
    if eta.eta_at_iso:
        unit = "turn" if eta.eta_unit == "turns" else "sample"
        text += f" (at {eta.eta_at_iso}, from the {basis} {unit} rate)"
    if eta.eta_by_tokens_s is not None:
        text += f" | by tokens {format_duration(eta.eta_by_tokens_s)}"
    return text


def _cost(state: str, cost: CostSection) -> str:
    gpus = f"{cost.gpus} GPU{'s' if cost.gpus != 1 else ''}"
    if not cost.gpu_hour_usd:
        return f"{gpus} | {cost.gpu_hours:,.2f} GPU-h (price unknown: --gpu-hour-usd)"
    projected = "" if state == JobState.DONE else f" | projected total {_usd(cost.projected_total_usd)}"
    return (
        f"{gpus} x ${cost.gpu_hour_usd:,.2f}/GPU-h | {cost.gpu_hours:,.2f} GPU-h"
        f" | {_usd(cost.usd)} so far{projected}"
    )


def render_spec(spec: SpecSection) -> str:
    """The accept-length line of the summary, naming its source; "" when there is none."""
    if spec.accept_length is None:
        return ""
    if spec.source == SOURCE_PER_REQUEST:
        window = f" | last minute {spec.window:.2f}" if spec.window is not None else ""
        return (
            f"accept length {spec.accept_length:.2f} per request (Σ tokens / Σ verify passes, "
            f"{spec.verify_passes:,} passes){window}"
        )
    return f"accept length {spec.accept_length:.2f} (the servers' lifetime average: no per-request stats)"


def worker_state(alive: bool, healthy: bool | None) -> str:
    """``up``, ``DOWN`` (its server fails its health check) or ``gone`` (no heartbeat)."""
    if not alive:
        return "gone"
    return "up" if healthy is not False else "DOWN"


def worker_rows(workers: Sequence[WorkerRow]) -> list[list[str]]:
    """One row of :data:`WORKER_HEADER` cells per worker (per GPU)."""
    return [
        [
            w.name,
            w.endpoint,
            worker_state(w.alive, w.healthy),
            f"{w.samples_per_s:,.2f}",
            f"{w.tokens_per_s:,.0f}",
            f"{w.samples:,}",
            f"{w.failed:,}",
            f"{w.inflight}/{w.max_inflight}",
            str(w.held_chunks),
            _n(w.spec_accept_length, 2) + ("*" if w.spec_accept_source == SOURCE_SERVER else ""),
            _n(w.spec_accept_length_window, 2),
            format_duration(w.last_seen_s) + " ago" if w.last_seen_s is not None else "-",
        ]
        for w in workers
    ]


def tuner_line(name: str, tuner: TunerState) -> str:
    """``gpu0 in-flight: settled on 128 (throughput stopped rising); measured 48: 27k, 72: 31k tok/s``."""
    curve = ", ".join(f"{p.target}: {p.tokens_per_s:,.0f}" for p in tuner.curve)
    where = f"{tuner.phase} on {tuner.target} ({tuner.reason})"
    return f"{name} in-flight {where}" + (f"; measured {curve} tok/s" if curve else "")


def footnotes(doc: ProgressDocument) -> list[str]:
    """The accept-length footnote (when a worker's figure is its server's average), each in-flight
    tuner's state, and the warnings."""
    notes = []
    if any(w.spec_accept_source == SOURCE_SERVER for w in doc.workers):
        notes.append(SERVER_AVERAGE_NOTE)
    notes += [tuner_line(w.name, w.tuner) for w in doc.workers if w.tuner is not None and w.alive]
    return notes + [f"! {warning}" for warning in doc.warnings]


# --- plain text ---------------------------------------------------------------------------------


def _bar(frac: float, width: int = 32) -> str:
    filled = min(width, int(frac * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(header).rstrip(), *(line(r).rstrip() for r in rows)]


def render(doc: ProgressDocument) -> str:
    """A human summary of a progress document, as plain text (no escape codes)."""
    frac = done_fraction(doc.samples.done, doc.samples.total)
    out = [f"{job_line(doc)}  {where_line(doc)}", f"{_bar(frac)} {frac:6.1%}  {done_line(doc)}", ""]
    out += [f"  {label:<10}{text}" for label, text in summary_rows(doc)]
    if doc.workers:
        table = _table(WORKER_HEADER, worker_rows(doc.workers), WORKER_RIGHT)
        out += ["", *("  " + line for line in table)]
    out += [f"  {note}" for note in footnotes(doc)]
    return "\n".join(out)


# --- the live table -----------------------------------------------------------------------------


def render_table(doc: ProgressDocument) -> RenderableType:
    """The same figures as :func:`render`, as a rich panel: a progress bar, the summary, the workers.

    Every text goes in as :class:`~rich.text.Text`, never as markup: a path or an endpoint such as
    ``http://[::1]:30000`` must show as it is.
    """
    done, total = doc.samples.done, doc.samples.total
    frac = done_fraction(done, total)
    progress = Table.grid(padding=(0, 1))
    progress.add_row(
        ProgressBar(total=max(total, 1), completed=done if total else 1, width=40),
        Text(f"{frac:6.1%}"),
        Text(done_line(doc)),
    )
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column(overflow="fold")
    for label, text in summary_rows(doc):
        summary.add_row(Text(label), Text(text))
    parts: list[RenderableType] = [Text(where_line(doc), overflow="fold"), progress, Text(""), summary]
    if doc.workers:
        workers = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, header_style="bold")
        for i, name in enumerate(WORKER_HEADER):
            justify: JustifyMethod = "right" if i in WORKER_RIGHT else "left"
            workers.add_column(name, justify=justify, overflow="fold")  # fold, not crop, when narrow
        for row in worker_rows(doc.workers):
            workers.add_row(
                *(Text(cell) for cell in row[:2]),
                Text(row[2], style=_WORKER_STYLE[row[2]]),
                *(Text(cell) for cell in row[3:]),
            )
        parts += [Text(""), workers]
    parts += [Text(note, style="yellow" if note.startswith("!") else "dim") for note in footnotes(doc)]
    style = _STATE_STYLE.get(doc.header.state, "none")
    return Panel(
        Group(*parts), title=Text(job_line(doc), style=style), title_align="left", border_style=style
    )
