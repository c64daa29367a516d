"""``python -m dflash_tasks.report --output URI``: the quality summary of a job, and a picture.

Prints the share of samples failing each check, the output-token and reasoning-token
distributions (per generated turn: a three-turn conversation adds three), the per-sample
speculative-decoding accept length (where the server reported it) and the gate verdict; writes
``report.png`` (histograms of output and reasoning lengths per turn and of the per-sample accept
length) into the output root, or to ``--png PATH``.

With a tokenizer (``--tokenizer``, else the served model's path when readable here), it also
counts every ok sample's loss tokens as the trainer will see the exported row (the model's chat
template, ``--train-max-length``, ``--train-last-turn-only``; :mod:`dflash_tasks.core.trainable`):
their distribution (printed, and a fourth panel), the dataset's total trainable tokens, and the
``few_loss_tokens`` and ``truncated_by_trainer`` gates. The total is also written to
``trainable.json`` in the output root, which ``status`` and ``progress.json`` show.

Low-acceptance samples are where a drafter has the most to learn: the accept-length histogram and
its low percentiles show how many there are.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import json_flag, load_settings, store_flags
from dflash_tasks.cli.trainer_flags import add_trainer_flags, view_from_args
from dflash_tasks.core.distribution import describe, describe_floats
from dflash_tasks.core.errors import DflashError, StoreError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.on_loop import tokens_saved
from dflash_tasks.core.quality import CHECKS, evaluate_gates
from dflash_tasks.core.record import Record
from dflash_tasks.core.repair import Superseded
from dflash_tasks.core.row_planner import ExportOptions, RowPlanner
from dflash_tasks.core.settings import CommonSettings
from dflash_tasks.core.source_quality import SOURCES_KEY, SourceTally, render_sources
from dflash_tasks.core.spec_stats import pooled_accept_length, spec_counts
from dflash_tasks.core.trainable import TRAINABLE_KEY, TrainableSummary, trainable_doc
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.core.yields import YieldTally
from dflash_tasks.store import open_store
from dflash_tasks.store.jobfiles import load_job, load_manifest
from dflash_tasks.store.records import iter_records

REPORT_PNG_KEY = "report.png"


@dataclass(slots=True)
class QualityReport:
    job_id: str
    thinking: bool
    samples: int = 0
    ok: int = 0
    failed: int = 0
    turns: int = 0  # generated turns of the ok samples
    chunks_done: int = 0
    chunks: int = 0
    checks: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    output_tokens: list[int] = field(default_factory=list)
    reasoning_tokens: list[int] = field(default_factory=list)
    accept_lengths: list[float] = field(default_factory=list)  # per ok sample with spec stats
    spec_tokens: int = 0
    spec_verify: int = 0
    gate_failures: list[str] = field(default_factory=list)
    trainable: TrainableSummary | None = None  # the default export's rows; None without a tokenizer
    trainer_note: str = ""
    yields: YieldTally | None = None  # None without a trainer view
    sources: SourceTally = field(default_factory=SourceTally)  # a job of several input sources
    source_gate_failures: dict[str, list[str]] = field(default_factory=dict)
    #: The budget that stopping loops left unspent: current records' and regenerated attempts'.
    loop_tokens_saved: int = 0

    @property
    def overall_accept_length(self) -> float | None:
        """Σ completion tokens / Σ verify passes over the samples with spec stats."""
        return pooled_accept_length(self.spec_tokens, self.spec_verify)

    def as_dict(self) -> dict[str, Any]:
        share = {c: (self.checks[c] / self.samples if self.samples else 0.0) for c in CHECKS}
        return {
            "job_id": self.job_id,
            "samples": self.samples,
            "ok": self.ok,
            "failed": self.failed,
            "turns": self.turns,
            "chunks_done": self.chunks_done,
            "chunks": self.chunks,
            "checks": {c: self.checks[c] for c in CHECKS},
            "check_shares": share,
            "finish_reasons": dict(self.finish_reasons),
            "output_tokens": describe(self.output_tokens),
            "reasoning_tokens": describe(self.reasoning_tokens),
            "spec_accept_length": {
                **describe_floats(self.accept_lengths),
                "overall": round(overall, 3) if (overall := self.overall_accept_length) else None,
            },
            "gates_passed": not self.gate_failures,
            "gate_failures": self.gate_failures,
            "trainable": None if self.trainable is None else self.trainable.to_dict(),
            "trainer_note": self.trainer_note,
            "yield": None if self.yields is None else self.yields.to_dict(),
            "sources": self.sources.to_dict() or None,
            "source_gate_failures": self.source_gate_failures or None,
            "loops": {
                "samples": self.checks["looping"],
                "share": round(self.checks["looping"] / self.samples, 4) if self.samples else 0.0,
                "tokens_saved": self.loop_tokens_saved,
            },
        }


def build_report(
    job: JobDefinition,
    records: Iterable[Record],
    chunks_done: int,
    chunks: int,
    trainer: TrainerView | None = None,
    superseded: Superseded | None = None,
) -> QualityReport:
    """The report; with ``trainer``, the ok samples' loss tokens too (when a tokenizer is at hand).

    ``superseded``: the ``on_replaced`` of the reader of ``records``, counted as generated once
    they are read."""
    report = QualityReport(job.job_id, job.spec.thinking, chunks_done=chunks_done, chunks=chunks)
    planner = RowPlanner(job, trainer, ExportOptions()) if trainer else None
    if planner is not None:  # the default export's rows, planned as the records stream by
        for _ in planner.rows(_tallied(report, records)):
            pass
    else:
        for record in _tallied(report, records):
            report.sources.add(record)
    failures = evaluate_gates(report.samples, report.checks, job.quality, job.spec.temperature)
    report.loop_tokens_saved += superseded.loop_tokens_saved if superseded is not None else 0
    if superseded is not None and planner is not None:
        planner.add_superseded(superseded)
    elif superseded is not None:
        report.sources.add_superseded(superseded)
    if planner is not None:
        report.yields = planner.yields
        report.trainable = planner.summary if planner.counted else None
        report.trainer_note = planner.note
        report.sources = planner.sources  # with the loss tokens of each source's planned rows
        if not planner.counted:
            for source in report.sources.sources.values():
                source.loss_tokens = None
    if report.trainable is not None:
        failures += evaluate_gates(report.trainable.samples, report.trainable.gate_counts(), job.quality)
    report.gate_failures = [f.message for f in failures]
    by_source = report.sources.gate_failures(job.quality, job.spec.temperature)
    report.source_gate_failures = {name: [f.message for f in fails] for name, fails in by_source.items()}
    return report


def _tallied(report: QualityReport, records: Iterable[Record]) -> Iterator[Record]:
    """``records``, each added to the report's distributions as it passes."""
    for record in records:
        _add(report, record)
        yield record


def _add(report: QualityReport, record: Record) -> None:
    report.samples += 1
    report.checks.update(record.checks or ())
    report.loop_tokens_saved += tokens_saved(record)
    if not record.ok:
        report.failed += 1
        return
    report.ok += 1
    for turn in record.turns:
        report.turns += 1
        report.finish_reasons[str(turn.finish_reason)] += 1
        report.output_tokens.append(turn.usage.completion_tokens)
        report.reasoning_tokens.append(turn.usage.reasoning_tokens)
    tokens, verify = spec_counts(record)
    if verify:
        report.accept_lengths.append(tokens / verify)
        report.spec_tokens += tokens
        report.spec_verify += verify


def render_text(report: QualityReport) -> str:
    doc = report.as_dict()
    out, rsn = doc["output_tokens"], doc["reasoning_tokens"]
    lines = [
        f"job {report.job_id}: {report.samples:,} samples ({report.ok:,} ok, {report.failed:,} failed"
        + (f"; {report.turns:,} turns" if report.turns != report.ok else "")
        + "), "
        f"chunks {report.chunks_done:,}/{report.chunks:,}, thinking {'on' if report.thinking else 'off'}",
        f"  output tokens     mean {out['mean']:,.0f}  p10 {out['p10']:,}  p50 {out['p50']:,}  "
        f"p90 {out['p90']:,}  max {out['max']:,}",
        f"  reasoning tokens  mean {rsn['mean']:,.0f}  p10 {rsn['p10']:,}  p50 {rsn['p50']:,}  "
        f"p90 {rsn['p90']:,}  max {rsn['max']:,}",
        _accept_line(doc["spec_accept_length"]),
        "  finish reasons    " + ", ".join(f"{k} {v:,}" for k, v in report.finish_reasons.most_common()),
        "  checks            "
        + ", ".join(f"{c} {report.checks[c]:,} ({doc['check_shares'][c]:.1%})" for c in CHECKS),
    ]
    loops = doc["loops"]
    if loops["samples"] or loops["tokens_saved"]:
        lines.append(
            f"  loops             {loops['samples']:,} samples stopped in a loop ({loops['share']:.1%}), "
            f"{loops['tokens_saved']:,} tokens of budget saved (regenerated attempts included)"
        )
    if report.trainer_note:
        lines.append(f"  {report.trainer_note}")
    if report.trainable is not None:
        lines.append(report.trainable.render())
    if report.yields is not None:
        lines.append(report.yields.render())
    if doc["sources"]:
        lines.append("per source:")
        lines += render_sources(doc["sources"])
        for name, messages in report.source_gate_failures.items():
            lines += [f"  source {name} fails a gate: {m}" for m in messages]
    if report.gate_failures:
        lines.append("gates FAILED:")
        lines += [f"  - {m}" for m in report.gate_failures]
    else:
        lines.append("gates passed")
    return "\n".join(lines)


def _accept_line(d: dict[str, Any]) -> str:
    if not d["count"]:
        return "  accept length     - (the server reported no per-request speculative stats)"
    return (
        f"  accept length     overall {d['overall']:.2f} (Σ tokens / Σ verify passes)  min {d['min']:.2f}  "
        f"p10 {d['p10']:.2f}  p25 {d['p25']:.2f}  p50 {d['p50']:.2f}  p90 {d['p90']:.2f}  "
        f"max {d['max']:.2f}  ({d['count']:,} samples)"
    )


def render_png(report: QualityReport) -> bytes:
    """Histograms of output and reasoning lengths and of the per-sample accept length, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4), dpi=100)
    panels: list[tuple[Any, list[int] | list[float], str, str, str]] = [
        (axes[0], report.output_tokens, "output tokens per turn", "tokens", "tab:blue"),
        (axes[1], report.reasoning_tokens, "reasoning tokens per turn", "tokens", "tab:orange"),
        (
            axes[2],
            report.accept_lengths,
            "accept length per sample (speculative decoding)",
            "tokens per verify pass",
            "tab:green",
        ),
    ]
    for ax, values, title, xlabel, color in panels:
        if values:
            ax.hist(values, bins=50, color=color, alpha=0.85)
            ax.axvline(statistics.fmean(values), color="black", linestyle="--", linewidth=1, label="mean")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("turns" if ax is not axes[2] else "samples")
    overall = report.overall_accept_length
    if overall is not None:
        axes[2].axvline(overall, color="tab:red", linewidth=1, label="Σ tokens / Σ verify passes")
        spread = describe_floats(report.accept_lengths)
        axes[2].axvspan(
            spread["min"], spread["p10"], color="tab:red", alpha=0.1, label="lowest 10%: most to learn"
        )
        axes[2].legend(fontsize="small")
    _loss_panel(axes[3], report.trainable)
    verdict = "gates passed" if not report.gate_failures else "gates FAILED"
    fig.suptitle(f"job {report.job_id}: {report.ok:,} ok samples, {verdict}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _loss_panel(ax: Any, trainable: TrainableSummary | None) -> None:
    """Loss tokens per sample, with the few_loss_tokens threshold and the total."""
    ax.set_title("loss tokens per sample (the trainer's view)")
    ax.set_xlabel("loss tokens")
    ax.set_ylabel("samples")
    if trainable is None or not trainable.loss_tokens:
        ax.text(0.5, 0.5, "not counted (no tokenizer)", ha="center", va="center", transform=ax.transAxes)
        return
    ax.hist(trainable.loss_tokens, bins=50, color="tab:purple", alpha=0.85)
    ax.axvline(
        trainable.min_loss_tokens,
        color="tab:red",
        linewidth=1,
        label=f"min_loss_tokens {trainable.min_loss_tokens} ({trainable.few:,} under)",
    )
    ax.axvline(
        statistics.fmean(trainable.loss_tokens), color="black", linestyle="--", linewidth=1, label="mean"
    )
    ax.legend(title=f"total {trainable.total:,}", fontsize="small")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("dflash_tasks.report"),
        description=__doc__.splitlines()[0],
        parents=[store_flags(), json_flag("print the summary as JSON")],
    )
    p.add_argument("--png", help=f"write the picture here (default: {REPORT_PNG_KEY} in the output root)")
    add_trainer_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = open_store(args.output, load_settings(CommonSettings, args))
        job, manifest = load_job(store), load_manifest(store)
        if job is None or manifest is None:
            raise StoreError(f"{args.output} holds no staged job")
        missing: list[int] = []
        view = view_from_args(args, job.trainer)
        superseded = Superseded()
        records = iter_records(store, manifest, missing, on_replaced=superseded)
        report = build_report(job, records, 0, manifest.chunks, view, superseded)
        report.chunks_done = manifest.chunks - len(missing)
        if report.trainable is not None:
            doc = trainable_doc(report.trainable, "report", manifest.samples)
            store.write(TRAINABLE_KEY, (json.dumps(doc, indent=2) + "\n").encode())
        if sources := report.sources.to_dict():
            store.write(SOURCES_KEY, (json.dumps(sources, indent=2) + "\n").encode())
        png = render_png(report)
        if args.png:
            with open(args.png, "wb") as fh:
                fh.write(png)
            where = args.png
        else:
            store.write(REPORT_PNG_KEY, png)
            where = f"{args.output.rstrip('/')}/{REPORT_PNG_KEY}"
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if args.json:
        print(json.dumps({**report.as_dict(), "png": where}))
    else:
        print(render_text(report))
        print(f"picture: {where}")
    return ExitCode.NOT_PASSED if report.gate_failures else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
