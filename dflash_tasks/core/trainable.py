"""What a drafter trainer will learn from a set of records: their loss tokens, summed up and judged.

:func:`counter_for` picks the tokenizer (``--tokenizer``, else the path the server reported in
``/model_info`` when that directory is readable here) and :class:`TrainableSummary` adds up the
ok records' :class:`~dflash_tasks.core.loss_tokens.RowTokens`: the distribution, the total (the
dataset's size for a drafter trainer), the samples with fewer than ``min_loss_tokens`` (the seed's
failure: 87% of its rows had 6) and those ``max_length`` cuts. :meth:`TrainableSummary.gate_counts`
feeds the ``few_loss_tokens`` and ``truncated_by_trainer`` gates of
:mod:`dflash_tasks.core.quality`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_tasks.core.distribution import describe
from dflash_tasks.core.loss_tokens import LossTokenCounter, RowTokens, load_tokenizer, row_messages
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainer_view import TrainerView

#: The gates judged on the trainer's view (thresholds in job.json's ``quality``).
FEW_LOSS_TOKENS = "few_loss_tokens"
TRUNCATED_BY_TRAINER = "truncated_by_trainer"
#: The latest count over a job's rows (written by the preflight and ``report``; read by ``status``).
TRAINABLE_KEY = "trainable.json"
_PROBE_REASONING = " ".join(["probe reasoning words"] * 8)
_PROBE_ANSWER = " ".join(["probe answer words"] * 4)


def served_model_path(records: Iterable[Record]) -> str | None:
    """The first ``model_path`` a record's server reported, if any."""
    for record in records:
        path = (record.server or {}).get("model_path")
        if isinstance(path, str) and path:
            return path
    return None


def counter_for(
    view: TrainerView, thinking: bool, served_path: str | None, preserve_thinking: bool = False
) -> tuple[LossTokenCounter | None, str]:
    """The counter for ``view`` and a line saying which tokenizer it uses, or why none.

    An explicit ``view.tokenizer`` that cannot be loaded raises :class:`ConfigError`; the served
    model's path is used only when it is a readable model directory here.
    """
    if view.tokenizer is not None:
        path, source = view.tokenizer, "--tokenizer"
    elif served_path and (Path(served_path) / "tokenizer_config.json").is_file():
        path, source = served_path, "the served model's path, from /model_info"
    else:
        why = (
            f"the served model path {served_path} is not readable here"
            if served_path
            else "no served model path is known"
        )
        return None, f"loss tokens not counted: no --tokenizer, and {why}"
    counter = LossTokenCounter(load_tokenizer(path), view, thinking, f"--tokenizer {path}", preserve_thinking)
    turns = "the last assistant turn" if view.last_turn_only else "every assistant turn"
    if preserve_thinking:
        turns += ", earlier turns' reasoning kept (preserve_thinking)"
    return counter, (
        f"loss tokens counted with the tokenizer and chat template at {path} ({source}), "
        f"max_length {view.max_length:,}, {turns}"
    )


def earlier_turns_trained(counter: LossTokenCounter) -> bool:
    """Whether the trainer learns from an earlier turn's reasoning and answer in a whole conversation."""
    user = {"role": "user", "content": "probe question", "reasoning_content": None}
    answer = {"role": "assistant", "content": _PROBE_ANSWER, "reasoning_content": _PROBE_REASONING}
    alone, both = counter.count_many([[user, answer], [user, answer, user, answer]])
    return both.loss_tokens_untruncated >= 2 * alone.loss_tokens_untruncated - 2


class TrainableTally:
    """Counts records as they stream by, :data:`BATCH` rows at a time (tokenized on every core);
    the tokenizer is picked at the first ok record. Read :attr:`summary` once every record is in."""

    BATCH = 256

    def __init__(
        self, view: TrainerView, thinking: bool, min_loss_tokens: int, preserve_thinking: bool = False
    ) -> None:
        self.view, self.thinking, self.preserve_thinking = view, thinking, preserve_thinking
        self._summary = TrainableSummary(min_loss_tokens, view.max_length)
        self._counter: LossTokenCounter | None = None
        self._resolved = False
        self._pending: list[list[dict[str, Any]]] = []
        self.note = ""  # which tokenizer counts, or why none does

    def add(self, record: Record) -> None:
        if not record.ok:
            return
        if not self._resolved:
            served = served_model_path([record])
            self._counter, self.note = counter_for(self.view, self.thinking, served, self.preserve_thinking)
            self._resolved = True
        if self._counter is not None:
            self._pending.append(row_messages(record))
            if len(self._pending) >= self.BATCH:
                self._flush()

    def _flush(self) -> None:
        if self._counter is not None and self._pending:
            for row in self._counter.count_many(self._pending):
                self._summary.add(row)
        self._pending = []

    @property
    def summary(self) -> TrainableSummary | None:
        """The counts, or None when no tokenizer was at hand."""
        self._flush()
        return self._summary if self._counter is not None else None


@dataclass(slots=True)
class TrainableSummary:
    """The loss tokens of the ok records counted so far."""

    min_loss_tokens: int
    max_length: int
    samples: int = 0
    loss_tokens: list[int] = field(default_factory=list)  # per sample
    few: int = 0  # samples with fewer than min_loss_tokens
    truncated: int = 0  # samples max_length cuts loss tokens off
    lost_to_max_length: int = 0
    reasoning_turns: int = 0
    reasoning_dropped: int = 0

    def add(self, row: RowTokens) -> None:
        self.samples += 1
        self.loss_tokens.append(row.loss_tokens)
        self.few += row.loss_tokens < self.min_loss_tokens
        self.truncated += row.truncated
        self.lost_to_max_length += row.lost_to_max_length
        self.reasoning_turns += row.reasoning_turns
        self.reasoning_dropped += row.reasoning_dropped

    @property
    def total(self) -> int:
        """The dataset's trainable tokens."""
        return sum(self.loss_tokens)

    def gate_counts(self) -> dict[str, int]:
        return {FEW_LOSS_TOKENS: self.few, TRUNCATED_BY_TRAINER: self.truncated}

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "total_loss_tokens": self.total,
            "loss_tokens": describe(sorted(self.loss_tokens)),
            "min_loss_tokens": self.min_loss_tokens,
            "few_loss_tokens": self.few,
            "max_length": self.max_length,
            "truncated_by_trainer": self.truncated,
            "loss_tokens_lost_to_max_length": self.lost_to_max_length,
            "reasoning_turns": self.reasoning_turns,
            "reasoning_dropped_by_template": self.reasoning_dropped,
        }

    def render(self) -> str:
        d = describe(sorted(self.loss_tokens))
        n = max(self.samples, 1)
        lines = [
            f"  loss tokens       total {self.total:,} over {self.samples:,} samples  mean {d['mean']:,.0f}  "
            f"p10 {d['p10']:,}  p50 {d['p50']:,}  p90 {d['p90']:,}  max {d['max']:,}",
            f"  trainer view      {self.few:,} ({self.few / n:.1%}) under {self.min_loss_tokens} loss "
            "tokens, "
            f"{self.truncated:,} ({self.truncated / n:.1%}) cut by max_length {self.max_length:,} "
            f"({self.lost_to_max_length:,} loss tokens lost)",
        ]
        if self.reasoning_dropped:
            lines.append(
                f"  reasoning         {self.reasoning_dropped:,} of {self.reasoning_turns:,} assistant "
                "turns' reasoning is not rendered by the chat template (earlier turns of multi-turn samples)"
            )
        return "\n".join(lines)


def trainable_doc(summary: TrainableSummary, source: str, samples_in_job: int) -> dict[str, Any]:
    """The ``trainable.json`` document: the count, who made it, and the job's projected total."""
    mean = summary.total / summary.samples if summary.samples else 0.0
    return {
        "source": source,
        "written_at": round(time.time(), 3),
        "counted_samples": summary.samples,
        "total_loss_tokens": summary.total,
        "mean_per_sample": round(mean, 1),
        "samples_in_job": samples_in_job,
        "projected_total_loss_tokens": round(mean * samples_in_job),
        "max_length": summary.max_length,
        "few_loss_tokens": summary.few,
        "truncated_by_trainer": summary.truncated,
    }


def describe_trainable(doc: Mapping[str, Any]) -> str:
    """One line for ``status``: the counted total, and the projection when not every sample is in."""
    counted, total = int(doc.get("counted_samples", 0)), int(doc.get("total_loss_tokens", 0))
    line = f"{total:,} loss tokens over {counted:,} samples (by {doc.get('source', '?')})"
    if counted < int(doc.get("samples_in_job", 0)):
        line += f", ~{int(doc.get('projected_total_loss_tokens', 0)):,} projected for the job"
    return line
