"""The preflight: generate a sample spread over the whole input, judge it, then run the rest.

Its chunks are ordinary chunks of the job, so their samples count toward the dataset and are
never generated twice. A failed preflight pauses the job, deletes the sample's outputs (they are
bad data) and exits non-zero with the likely cause.

Projections count generations: a three-turn conversation costs three requests, so the rate is
measured per turn (its latency and tokens) and applied to the turns left in the job.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.core.distribution import describe
from dflash_tasks.core.job import JobDefinition, Manifest, output_key
from dflash_tasks.core.quality import (
    CHECKS,
    GateFailure,
    QualitySettings,
    count_checks,
    evaluate_gates,
    judged,
)
from dflash_tasks.core.record import Record
from dflash_tasks.core.row_planner import RowPlanner
from dflash_tasks.core.source_quality import SourceTally
from dflash_tasks.core.trainable import TrainableSummary, TrainableTally
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.core.yields import YieldTally, cost_per_million_trainable
from dflash_tasks.monitoring.progress_bar import format_duration
from dflash_tasks.producer.preflight_budget import BudgetProjection, project_budgets, render_budgets
from dflash_tasks.producer.preflight_yield import planned_yield, what_would_raise
from dflash_tasks.store import Store
from dflash_tasks.store.records import read_current

PREFLIGHT_KEY = "preflight.json"


def preflight_chunks(manifest: Manifest, samples: int) -> list[int]:
    """Chunks covering about ``samples`` prompts, spread evenly over the input.

    When the job has multi-turn conversations and none of those chunks holds one, the chunk with
    the most turns per sample is added: the sample must show what multi-turn generation costs.
    """
    wanted = max(1, -(-samples // manifest.chunk_size))
    if wanted >= manifest.chunks:
        return list(range(manifest.chunks))
    chosen = _spread(0, manifest.chunks - 1, wanted)
    if manifest.sources:  # each source in proportion to its samples, at least one chunk each
        chosen = set()
        for source in manifest.sources:
            if source.get("first_chunk") is not None:
                first, last = source["first_chunk"], source["last_chunk"]
                share = round(wanted * source["samples"] / max(manifest.samples, 1))
                chosen |= _spread(first, last, share) if share > 1 else {(first + last) // 2}
    if manifest.chunk_turns is not None:

        def extra_turns(c: int) -> float:
            return manifest.turns_of(c) / manifest.chunk_samples(c)

        if all(manifest.turns_of(c) == manifest.chunk_samples(c) for c in chosen):
            chosen.add(max(range(manifest.chunks), key=extra_turns))
    return sorted(chosen)


def _spread(first: int, last: int, count: int) -> set[int]:
    """``count`` chunks spread evenly over ``first..last``."""
    if count >= last - first + 1:
        return set(range(first, last + 1))
    step = (last - first) / (count - 1) if count > 1 else 0
    return {first + round(i * step) for i in range(count)}


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """What the preflight sample shows, and what it projects for the full run."""

    samples: int
    seconds: float
    output_tokens: list[int]  # per generated turn
    counts: dict[str, int]
    failures: list[GateFailure]
    mean_latency: float  # per request (one turn)
    slots: int
    remaining: int  # turns (generations) left in the job after the preflight
    gpu_hour_usd: float
    workers: int
    turns: int = 0  # requests the preflight sample sent
    multi_turn: int = 0  # samples with more than one turn
    remaining_samples: int | None = None
    trainable: TrainableSummary | None = None  # None when no tokenizer was at hand
    trainer_note: str = ""  # which tokenizer counted the loss tokens, or why none did
    tuned_workers: int = 0  # of ``workers``, those whose in-flight tuner moves their target
    source_failures: dict[str, list[str]] = field(default_factory=dict)  # source -> gates its samples fail
    yields: YieldTally | None = None  # the default export's yield on the sample (None without a job)
    layout: str = ""  # the layout that export would write
    budgets: tuple[BudgetProjection, ...] = ()  # the chosen --max-tokens against the alternatives

    def generated_tokens_per_s(self) -> float:
        """Completion tokens/s of the full run at the projected rate."""
        mean = statistics.fmean(self.output_tokens) if self.output_tokens else 0.0
        return self.projected_rate() * mean

    def usd_per_million_generated(self) -> float | None:
        """A million generated tokens' cost at the projected rate; None without a price or a rate."""
        rate = self.generated_tokens_per_s()
        if self.gpu_hour_usd <= 0 or rate <= 0:
            return None
        return self.workers * self.gpu_hour_usd / 3600 / rate * 1e6

    def usd_per_million_trainable(self) -> float | None:
        if self.yields is None:
            return None
        return cost_per_million_trainable(self.yields.ratio, self.usd_per_million_generated())

    def low_yield(self) -> list[str]:
        """What would raise a projected yield under the target (empty when it is met or unknown)."""
        return [] if self.yields is None else what_would_raise(self.yields, self.layout)

    @property
    def passed(self) -> bool:
        return not self.failures

    def projected_rate(self) -> float:
        """Turns (requests)/s of the full run: every slot busy at the measured per-request latency."""
        return self.slots / self.mean_latency if self.mean_latency > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        rate = self.projected_rate()
        eta = self.remaining / rate if rate > 0 else None
        return {
            "samples": self.samples,
            "turns": self.turns,
            "multi_turn_samples": self.multi_turn,
            "seconds": round(self.seconds, 1),
            "passed": self.passed,
            "checks": self.counts,
            "failures": [
                {"check": f.check, "share": f.share, "threshold": f.threshold} for f in self.failures
            ],
            "output_tokens": describe(self.output_tokens),
            "mean_latency_s": round(self.mean_latency, 2),
            "projected_turns_per_s": round(rate, 3),
            "remaining_turns": self.remaining,
            "remaining_samples": self.remaining_samples,
            "projected_eta_s": None if eta is None else round(eta),
            "projected_cost_usd": None
            if eta is None
            else round(eta / 3600 * self.workers * self.gpu_hour_usd, 2),
            "workers": self.workers,
            "tuned_workers": self.tuned_workers,
            "trainable": None if self.trainable is None else self.trainable.to_dict(),
            "trainer_note": self.trainer_note,
            "source_failures": self.source_failures or None,
            "yield": None if self.yields is None else self.yields.to_dict(),
            "layout": self.layout or None,
            "usd_per_million_trainable": _rounded(self.usd_per_million_trainable()),
            "raise_yield": self.low_yield(),
            "budgets": [b.to_dict(self.usd_per_million_generated()) for b in self.budgets] or None,
        }

    def render(self) -> str:
        doc = self.to_dict()
        dist = doc["output_tokens"]
        share = {check: self.counts.get(check, 0) / self.samples for check in CHECKS} if self.samples else {}
        turns = (
            f" ({self.turns} turns generated, {self.multi_turn} multi-turn conversations)"
            if self.turns != self.samples
            else ""
        )
        lines = [
            f"preflight: {self.samples} samples{turns} in {format_duration(self.seconds)}",
            f"  output tokens  mean {dist['mean']:,.0f}  p10 {dist['p10']:,}  p50 {dist['p50']:,}  "
            f"p90 {dist['p90']:,}  max {dist['max']:,}",
            "  " + "  ".join(f"{check} {share.get(check, 0.0):.1%}" for check in CHECKS),
        ]
        if self.trainer_note:
            lines.append(f"  {self.trainer_note}")
        if self.trainable is not None:
            lines.append(self.trainable.render())
        if self.yields is not None:
            lines.append(self.yields.render())
            per_m = self.usd_per_million_trainable()
            if per_m is not None:
                lines.append(f"  cost              ~${per_m:,.2f} per million trainable tokens")
            if raise_it := self.low_yield():
                lines.append(f"  low yield: what would raise it ({self.layout} layout)")
                lines += [f"    - {line}" for line in raise_it]
            lines += render_budgets(list(self.budgets), self.usd_per_million_generated())
        rate = self.projected_rate()
        if rate > 0:
            eta = self.remaining / rate
            cost = eta / 3600 * self.workers * self.gpu_hour_usd
            per_worker = self.slots // max(self.workers, 1)
            multi = self.turns != self.samples or self.remaining_samples not in (None, self.remaining)
            unit = "turns" if multi else "samples"
            left = f"{self.remaining:,} {unit}"
            if multi and self.remaining_samples is not None:
                left += f" ({self.remaining_samples:,} samples)"
            tuned = ""
            if self.tuned_workers:  # the target they ran the preflight at, not where they settle
                some = "" if self.tuned_workers == self.workers else f"{self.tuned_workers} of them "
                tuned = f" ({some}tuning it from there)"
            lines.append(
                f"  projected: {rate:,.2f} {unit}/s with {self.workers} workers x {per_worker}"
                f" in flight{tuned}, ETA {format_duration(eta)} for {left}"
                + (f", ~${cost:,.0f}" if self.gpu_hour_usd > 0 else "")
            )
        for name, messages in self.source_failures.items():
            lines += [f"  source {name} fails a gate: {m}" for m in messages]
        if self.failures:
            lines.append("preflight FAILED:")
            lines += [f"  - {f.message}" for f in self.failures]
        else:
            lines.append("preflight passed: queuing the full job")
        return "\n".join(lines)


def judge(
    store: Store,
    chunks: Sequence[int],
    settings: QualitySettings,
    seconds: float,
    slots: int,
    workers: int,
    remaining: int,
    gpu_hour_usd: float,
    remaining_samples: int | None = None,
    trainer: TrainerView | None = None,
    thinking: bool = True,
    preserve_thinking: bool = False,
    tuned_workers: int = 0,
    job: JobDefinition | None = None,
) -> PreflightReport:
    """Read the preflight chunks' records (their current ones: repairs included) and apply the
    gates to all but transient failures, which repair rounds regenerate; ``remaining`` counts turns.

    With ``trainer`` and ``job``, the records are planned as the default export plans them (the
    rows ``report`` judges, and the yield it and ``export`` would state), and those rows' loss
    tokens are judged by the ``few_loss_tokens`` and ``truncated_by_trainer`` gates; with
    ``trainer`` alone, each ok record is counted as one conversation.
    """
    records = [r for chunk in chunks for r in read_current(store, chunk)]
    total, counts = count_checks(judged(records))
    temperature = job.spec.temperature if job is not None else None
    failures = evaluate_gates(total, counts, settings, temperature)
    plan = planned_yield(job, trainer, records) if job is not None and trainer is not None else None
    trainable, note = _trainable(records, plan, trainer, thinking, preserve_thinking, settings)
    if trainable is not None:
        failures += evaluate_gates(trainable.samples, trainable.gate_counts(), settings)
    turns = [t for r in records for t in r.turns]
    ok = [t for t in turns if t.ok]
    return PreflightReport(
        samples=total,
        seconds=seconds,
        output_tokens=sorted(t.usage.completion_tokens for t in ok),
        counts=dict(counts),
        failures=failures,
        mean_latency=statistics.fmean([t.latency_s for t in ok]) if ok else 0.0,
        slots=slots,
        remaining=remaining,
        gpu_hour_usd=gpu_hour_usd,
        workers=workers,
        turns=len(turns),
        multi_turn=sum(1 for r in records if r.user_turns > 1),
        remaining_samples=remaining_samples,
        trainable=trainable,
        trainer_note=note,
        tuned_workers=tuned_workers,
        source_failures=_source_failures(records, settings, temperature),
        yields=None if plan is None else plan.yields,
        layout="" if plan is None else plan.layout,
        budgets=_budgets(plan, records, job),
    )


def _source_failures(
    records: Sequence[Record], settings: QualitySettings, temperature: float | None
) -> dict[str, list[str]]:
    """Each source's failed gates' messages, over the judged records."""
    by_source = SourceTally()
    for record in judged(records):
        by_source.add(record)
    return {
        name: [f.message for f in fails]
        for name, fails in by_source.gate_failures(settings, temperature).items()
    }


def _budgets(
    plan: RowPlanner | None, records: list[Record], job: JobDefinition | None
) -> tuple[BudgetProjection, ...]:
    """The chosen budget against the alternatives, where the sample's loss tokens were counted."""
    if plan is None or job is None or not plan.counted or plan.written_loss is None:
        return ()
    return tuple(project_budgets(records, plan.written_loss, plan.view.max_length, job.spec, plan.yields))


def _trainable(
    records: list[Record],
    plan: RowPlanner | None,
    trainer: TrainerView | None,
    thinking: bool,
    preserve_thinking: bool,
    settings: QualitySettings,
) -> tuple[TrainableSummary | None, str]:
    """The sample's loss tokens and the trainer's note: the rows ``report`` would judge, counted
    once (stored counts where they are); with a trainer and no job, each ok record as one row."""
    if plan is not None:
        return (plan.summary if plan.counted else None), plan.note
    if trainer is None:
        return None, ""
    tally = TrainableTally(trainer, thinking, settings.min_loss_tokens, preserve_thinking)
    for record in records:
        tally.add(record)
    return tally.summary, tally.note


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def wait_for_chunks(
    store: Store,
    chunks: Sequence[int],
    timeout: float,
    on_progress: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[int] | None:
    """Poll the store until every chunk in ``chunks`` is done, or ``stop()`` says to judge now.

    Returns the chunks done (all of them, unless stopped early), or None on timeout.
    """
    deadline = time.monotonic() + timeout
    pending = set(chunks)
    while True:
        pending = {c for c in pending if not store.exists(output_key(c))}
        if on_progress is not None:
            on_progress(len(chunks) - len(pending))
        if not pending or (stop is not None and stop() and len(pending) < len(chunks)):
            return [c for c in chunks if c not in pending]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def wait_for_leases(
    bk: Bookkeeping, job_id: str, chunks: Sequence[int], timeout: float, poll: float = 0.5
) -> bool:
    """Wait until none of ``chunks`` holds a live lease (no worker runs one); False on timeout."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        running = sorted(set(bk.live_leases(job_id)) & set(chunks))
        if not running:
            return True
        if not said:
            print(
                f"waiting for {len(running)} preflight chunk(s) still being generated to stop, so that "
                "their outputs can be deleted ...",
                file=sys.stderr,
            )
            said = True
        if time.monotonic() > deadline:
            print(f"gave up waiting for chunks {running}: re-run enqueue after the fix", file=sys.stderr)
            return False
        time.sleep(poll)


def print_progress(total: int) -> Callable[[int], None]:
    last = [-1]

    def show(done: int) -> None:
        if done != last[0]:
            last[0] = done
            print(f"preflight: {done}/{total} chunks done", file=sys.stderr, flush=True)

    return show
