"""The run view: the progress document (``status --json``'s) as HTML, and every GPU's row.

Each figure carries its document path and raw value (:func:`~.layout.figure`), so what the page
shows can be checked against ``status --json``. Sections of the document this view does not know
by name but that describe what the trainer gets (any top-level key naming ``trainable`` or
``yield``) are shown as they are, so a new figure appears without a change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from dflash_tasks.monitoring.page.layout import esc, figure, frame, key_values, table
from dflash_tasks.monitoring.progress_bar import format_duration
from dflash_tasks.monitoring.status_view import done_fraction, worker_state

#: Top-level keys shown in the yield section, whatever they hold (the trainer's share of the data).
YIELD_WORDS = ("trainable", "yield")


def run_page(doc: Mapping[str, Any], repair_rounds: Mapping[int, int]) -> str:
    """The whole run view: progress, cost, yield, gates, failures, throughput, GPUs, warnings."""
    parts = [
        f"<h1>job {esc(doc['job_id'])} {figure('state', doc['state'])}</h1>",
        f"<p class='muted'>{esc(doc['model'])} → {esc(doc['output'])} · computed at "
        f"{figure('updated_at_iso', doc['updated_at_iso'])} by {esc(doc.get('writer') or '?')}</p>",
        _progress(doc),
        "<h2>cost</h2>",
        cost_section(doc),
        "<h2>what the trainer gets</h2>",
        _yield(doc),
        "<h2>quality gates</h2>",
        _gates(doc),
        "<h2>failures and repairs</h2>",
        _failures(doc, repair_rounds),
        "<h2>throughput</h2><img src='/throughput.svg' alt='tokens per second over time'>",
        "<h2 id='gpus'>every GPU</h2>",
        gpu_table(doc["workers"]),
        _warnings(doc),
    ]
    return frame(f"job {doc['job_id']}", "".join(parts))


def fig(doc: Mapping[str, Any], path: str) -> str:
    """:func:`~.layout.figure` of the document's value at a dotted ``path``."""
    value: Any = doc
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return figure(path, value)


def _progress(doc: Mapping[str, Any]) -> str:
    pct = done_fraction(doc["samples"]["done"], doc["samples"]["total"])
    eta = "finished" if doc["state"] == "done" else format_duration(doc["eta_s"])
    at = f" (at {esc(doc['eta_at_iso'])})" if doc.get("eta_at_iso") else ""
    source = esc((doc.get("spec") or {}).get("source") or "-")

    def f(path: str) -> str:
        return fig(doc, path)

    return (
        f"<div class='bar'><div style='width:{pct * 100:.1f}%'></div></div>"
        f"<p>{f('samples.done')} / {f('samples.total')} samples ({pct:.1%})</p>"
        + key_values(
            [
                (
                    "samples",
                    f"{f('samples.ok')} ok, {f('samples.failed')} failed, "
                    f"{f('samples.repaired')} repaired, {f('samples.remaining')} left",
                ),
                (
                    "chunks",
                    f"{f('chunks.done')} done, {f('chunks.running')} running, "
                    f"{f('chunks.pending')} pending of {f('chunks.total')}",
                ),
                (
                    "rate (last minute)",
                    f"{f('rates.samples_per_s')} samples/s, {f('rates.tokens_per_s')} tok/s",
                ),
                (
                    "rate (since start)",
                    f"{f('rates.since_start.samples_per_s')} samples/s, "
                    f"{f('rates.since_start.tokens_per_s')} tok/s",
                ),
                ("ETA", figure("eta_s", doc["eta_s"], eta) + at),
                ("elapsed", figure("elapsed_s", doc["elapsed_s"], format_duration(doc["elapsed_s"]))),
                ("tokens", f"{f('tokens.generated')} generated, {f('tokens.avg_per_sample')} per sample"),
                ("accept length", f"{f('spec_accept_length')} <span class='muted'>({source})</span>"),
            ]
        )
    )


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def cost_section(doc: Mapping[str, Any]) -> str:
    cost = doc["cost"]
    price, projected = cost["gpu_hour_usd"], cost["projected_total_usd"]
    return key_values(
        [
            ("GPUs", figure("cost.gpus", cost["gpus"])),
            ("GPU-hours", figure("cost.gpu_hours", cost["gpu_hours"])),
            (
                "price",
                figure(
                    "cost.gpu_hour_usd",
                    price,
                    f"${price:,.2f}/GPU-h" if price else "unknown (--gpu-hour-usd)",
                ),
            ),
            (
                "spent",
                figure("cost.usd", cost["usd"], "-" if cost["usd"] is None else f"${cost['usd']:,.2f}"),
            ),
            ("projected total", figure("cost.projected_total_usd", projected, _usd(projected))),
            ("per million trainable tokens", _per_million(doc)),
        ]
    )


def spent_per_million_trainable(doc: Mapping[str, Any]) -> float | None:
    """USD spent per million trainable (loss) tokens, or None without a spend or a count.

    The live yield's figure when the workers counted (``yield``), else from the latest
    ``trainable.json``: the spend covers the done samples and ``trainable_tokens`` its
    ``counted_samples``; a count of fewer samples is scaled to the done ones by its mean.
    """
    live = (doc.get("yield") or {}).get("usd_per_million_trainable")
    if isinstance(live, int | float):
        return float(live)
    usd = (doc.get("cost") or {}).get("usd")
    counted = doc.get("trainable_tokens") or {}
    total, samples = counted.get("total_loss_tokens"), counted.get("counted_samples")
    if usd is None or not total:
        return None
    done = (doc.get("samples") or {}).get("done")
    trainable = float(total) * done / samples if samples and done else float(total)
    return float(usd) / trainable * 1e6


def _per_million(doc: Mapping[str, Any]) -> str:
    value = spent_per_million_trainable(doc)
    if value is None:
        return "<span class='muted'>not counted yet (a price and a trainable-token count)</span>"
    return figure("cost_per_million_trainable_usd", round(value, 4), f"${value:,.2f}")


def yield_sections(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The document's sections about the trainable data: every key naming one of :data:`YIELD_WORDS`."""
    return [(k, v) for k, v in doc.items() if any(w in k for w in YIELD_WORDS) and isinstance(v, Mapping)]


def _yield(doc: Mapping[str, Any]) -> str:
    sections = yield_sections(doc)
    if not sections:
        return (
            "<p class='muted'>no trainable-token count yet "
            "(the preflight or <code>report</code> writes trainable.json)</p>"
        )
    out = []
    for name, section in sections:
        rows = [
            (k, figure(f"{name}.{k}", v)) for k, v in section.items() if not isinstance(v, (Mapping, list))
        ]
        out.append(f"<h3>{esc(name)}</h3>" + key_values(rows))
    return "".join(out)


def gate_shares(doc: Mapping[str, Any]) -> list[tuple[str, int, float]]:
    """(check, samples failing it, share of the done samples) from the job's ``check_*`` counters."""
    done = max(int(doc["samples"]["done"]), 1)
    counters = doc.get("counters") or {}
    return [
        (name[len("check_") :], int(n), int(n) / done)
        for name, n in sorted(counters.items())
        if name.startswith("check_")
    ]


def _gates(doc: Mapping[str, Any]) -> str:
    shares, counters = gate_shares(doc), doc.get("counters") or {}
    if not shares:
        return "<p class='muted'>no sample failed a quality check (or the checks have not run)</p>"
    rows = [
        [
            f"<a href='/samples?check={esc(name)}'>{esc(name)}</a>",
            f"<td class='n'>{figure(f'counters.check_{name}', counters[f'check_{name}'], f'{n:,}')}</td>",
            f"<td class='n'>{share:.1%}</td>",
        ]
        for name, n, share in shares
    ]
    return table(["check", "samples", "share of done"], rows)


def _failures(doc: Mapping[str, Any], repair_rounds: Mapping[int, int]) -> str:
    s = doc["samples"]
    rounds = ", ".join(
        f"round {r}: {n} chunk{'s' if n != 1 else ''}" for r, n in sorted(repair_rounds.items())
    )
    return key_values(
        [
            (
                "failed samples",
                f"<a href='/samples?outcome=failed'>{figure('samples.failed', s['failed'])}</a>",
            ),
            ("repaired samples", figure("samples.repaired", s["repaired"])),
            ("repair rounds", esc(rounds or "none")),
        ]
    ) + failure_breakdown(doc)


def failure_breakdown(doc: Mapping[str, Any]) -> str:
    """Failed samples by kind (permanent, transient), per input source: the figures ``report``
    counted (``sources.NAME.failures``), the only breakdown the document carries."""
    sources = doc.get("sources") or {}
    if not sources:
        return (
            "<p class='muted'>failures by kind are counted per input source by <code>report</code> "
            "(a job of several sources); <a href='/samples?outcome=failed'>the failed samples</a> "
            "each show their error and kind</p>"
        )
    rows = []
    for name, figures in sources.items():
        failures = figures.get("failures")
        href = esc("/samples?" + urlencode({"outcome": "failed", "source": name}))
        if failures is None:
            rows.append([esc(name), "<span class='muted'>not counted yet (run report)</span>", ""])
            continue
        kinds = ", ".join(
            f"{esc(kind)} {figure(f'sources.{name}.failures.{kind}', n, f'{n:,}')}"
            for kind, n in sorted(failures.items())
        )
        failed = figures.get("failed")
        rows.append(
            [
                f"<a href='{href}'>{esc(name)}</a>",
                figure(f"sources.{name}.failed", failed),
                kinds or "none",
            ]
        )
    return "<h3>failures by kind, per input source</h3>" + table(["source", "failed", "by kind"], rows)


def gpu_table(workers: list[dict[str, Any]]) -> str:
    """One row per worker (per GPU and its server)."""
    if not workers:
        return "<p class='muted'>no worker has reported on this job (Redis gone, or none started)</p>"
    header = [
        "worker",
        "endpoint",
        "state",
        "tok/s",
        "samples/s",
        "samples",
        "failed",
        "in flight / target",
        "waiting",
        "held chunks",
        "tuner",
        "accept length",
        "accept (1 min)",
        "seen",
    ]
    rows = [_gpu_row(i, w) for i, w in enumerate(workers)]
    return table(header, rows, "gpus")


def _gpu_row(i: int, w: Mapping[str, Any]) -> list[str]:
    tuner = w.get("tuner") or {}
    phase = f"{tuner.get('phase', '?')} on {tuner.get('target', '?')}" if tuner else "fixed"
    curve = ", ".join(f"{p.get('target')}: {p.get('tokens_per_s', 0):,.0f}" for p in tuner.get("curve", []))
    seen = "-" if w.get("last_seen_s") is None else format_duration(w["last_seen_s"]) + " ago"

    def n(key: str) -> str:
        return f"<td class='n'>{figure(f'workers.{i}.{key}', w.get(key))}</td>"

    return [
        esc(w["name"]),
        esc(w.get("endpoint") or ""),
        esc(worker_state(w["alive"], w["healthy"])),
        n("tokens_per_s"),
        n("samples_per_s"),
        n("samples"),
        n("failed"),
        f"<td class='n'>{figure(f'workers.{i}.inflight', w.get('inflight'))} / "
        f"{figure(f'workers.{i}.max_inflight', w.get('max_inflight'))}</td>",
        n("waiting"),
        n("held_chunks"),
        esc(phase) + (f"<br><span class='muted'>{esc(curve)} tok/s</span>" if curve else ""),
        n("spec_accept_length"),
        n("spec_accept_length_window"),
        esc(seen),
    ]


def _warnings(doc: Mapping[str, Any]) -> str:
    warnings = doc.get("warnings") or []
    if not warnings:
        return ""
    return "<h2>warnings</h2><ul>" + "".join(f"<li class='warn'>{esc(w)}</li>" for w in warnings) + "</ul>"
