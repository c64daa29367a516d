"""Per input source figures of a job of several sources: counts, failures by cause, truncation,
checks, output and loss tokens, and each source's share of the GPU cost.

A source's cost share is its share of the job's generated (output) tokens: the GPU time a sample
takes follows the tokens it generates. They are its records' turns' and those of the attempts
repair rounds replaced (:meth:`SourceTally.add_superseded`), as the yield's generated total counts
them, so that the sources' add up to it. ``report`` writes the figures to ``sources.json`` in the
output root; ``status`` and ``progress.json`` show the latest one beside the staged counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.core.on_loop import tokens_saved
from dflash_tasks.core.quality import GateFailure, QualitySettings, evaluate_gates
from dflash_tasks.core.record import Record
from dflash_tasks.core.repair import Superseded
from dflash_tasks.core.states import Outcome

SOURCES_KEY = "sources.json"


@dataclass(slots=True)
class SourceQuality:
    """One source's records so far."""

    samples: int = 0
    ok: int = 0
    failed: int = 0
    truncated: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # failed records by cause
    checks: Counter[str] = field(default_factory=Counter)
    output_tokens: int = 0
    loss_tokens: int | None = None  # None when no tokenizer counted them
    few_loss_tokens: int = 0
    rows_exported: int = 0  # rows of the export's plan (filled by the export's planner only)
    loop_tokens_saved: int = 0  # the budget its looped records' stops left unspent

    def add(self, record: Record) -> None:
        self.samples += 1
        self.checks.update(record.checks or ())
        self.output_tokens += record.generated_tokens
        self.loop_tokens_saved += tokens_saved(record)
        if record.outcome is Outcome.TRUNCATED:
            self.truncated += 1
        if record.ok:
            self.ok += 1
        else:
            self.failed += 1
            self.failures[record.failure.value if record.failure is not None else "unknown"] += 1

    def gate_failures(self, settings: QualitySettings, temperature: float | None = None) -> list[GateFailure]:
        return evaluate_gates(self.samples, self.checks, settings, temperature)

    def to_dict(self, all_output_tokens: int) -> dict[str, Any]:
        share = self.output_tokens / all_output_tokens if all_output_tokens else 0.0
        return {
            "samples": self.samples,
            "ok": self.ok,
            "failed": self.failed,
            "failures": dict(self.failures),
            "truncated": self.truncated,
            "truncated_share": round(self.truncated / self.samples, 4) if self.samples else 0.0,
            "checks": dict(self.checks),
            "looping": self.checks["looping"],
            "looping_share": round(self.checks["looping"] / self.samples, 4) if self.samples else 0.0,
            "loop_tokens_saved": self.loop_tokens_saved,
            "output_tokens": self.output_tokens,
            "loss_tokens": self.loss_tokens,
            "few_loss_tokens": self.few_loss_tokens if self.loss_tokens is not None else None,
            "cost_share": round(share, 4),
        }


class SourceTally:
    """Records by source, as they stream by (records without a source are not counted)."""

    def __init__(self) -> None:
        self.sources: dict[str, SourceQuality] = {}

    def add(self, record: Record) -> None:
        if record.source is None:
            return
        self.sources.setdefault(record.source, SourceQuality()).add(record)

    def add_superseded(self, superseded: Superseded) -> None:
        """The attempts repair rounds replaced, to the sources of their records: their tokens
        count as output (paid for), their stops' savings as saved."""
        for name, source in self.sources.items():
            source.output_tokens += superseded.source_tokens[name]
            source.loop_tokens_saved += superseded.source_saved[name]

    def add_row(self, name: str | None, loss_tokens: int | None, min_loss_tokens: int) -> None:
        """One row of the export's plan, to the source of its record, with its loss tokens when counted."""
        source = self.sources.get(name) if name is not None else None
        if source is None:
            return
        source.rows_exported += 1
        if loss_tokens is not None:
            source.loss_tokens = (source.loss_tokens or 0) + loss_tokens
            source.few_loss_tokens += loss_tokens < min_loss_tokens

    def to_dict(self) -> dict[str, dict[str, Any]]:
        total = sum(s.output_tokens for s in self.sources.values())
        return {name: s.to_dict(total) for name, s in sorted(self.sources.items())}

    def gate_failures(
        self, settings: QualitySettings, temperature: float | None = None
    ) -> dict[str, list[GateFailure]]:
        """The sources whose own samples fail a gate, with the gates they fail."""
        out = {name: s.gate_failures(settings, temperature) for name, s in sorted(self.sources.items())}
        return {name: fails for name, fails in out.items() if fails}


def render_sources(doc: Mapping[str, Mapping[str, Any]], cost_usd: float | None = None) -> list[str]:
    """One line per source: samples, failures by cause, truncation, tokens, cost."""
    lines = []
    for name, s in doc.items():
        causes = ", ".join(f"{k} {v:,}" for k, v in sorted(s["failures"].items())) or "none"
        loss = "" if s.get("loss_tokens") is None else f", loss tokens {s['loss_tokens']:,}"
        cost = f" (~${cost_usd * s['cost_share']:,.2f})" if cost_usd else ""
        looping = s.get("looping") or 0
        loops = f", looping {looping:,} ({s['looping_share']:.1%})" if looping else ""
        lines.append(
            f"  {name}: {s['samples']:,} samples, {s['ok']:,} ok, {s['failed']:,} failed ({causes}), "
            f"truncated {s['truncated']:,} ({s['truncated_share']:.1%}){loops}, output tokens "
            f"{s['output_tokens']:,}{loss}, cost share {s['cost_share']:.1%}{cost}"
        )
    return lines


def progress_sources(
    staged: list[dict[str, Any]] | None, quality: Mapping[str, Any] | None, spent: float | None
) -> dict[str, Any] | None:
    """Per input source: its staged counts, and the latest report's figures with its cost share."""
    if not staged:
        return None
    out: dict[str, Any] = {}
    for source in staged:
        name = str(source.get("name"))
        figures = dict((quality or {}).get(name) or {})
        share = figures.get("cost_share")
        out[name] = {
            "staged_samples": source.get("samples"),
            "invalid": source.get("invalid"),
            **figures,
            "usd": round(spent * share, 2) if spent is not None and isinstance(share, int | float) else None,
        }
    return out
