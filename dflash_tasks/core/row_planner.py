"""Which rows the export writes, counted once: the rows, the counts per reason, the trainable yield.

``export`` writes what :meth:`RowPlanner.rows` yields; ``report`` runs the same planner without
writing, so both state the same yield. Records are taken in batches and their candidate rows
(:mod:`dflash_tasks.core.export_rows`) counted together under the trainer's view.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.export_rows import (
    LAYOUTS,
    MODES,
    Candidate,
    conversation_candidate,
    count,
    per_turn_candidates,
    within_horizon,
)
from dflash_tasks.core.job import JobDefinition
from dflash_tasks.core.loss_counts import view_key
from dflash_tasks.core.loss_tokens import LossTokenCounter, row_messages
from dflash_tasks.core.record import Record
from dflash_tasks.core.repair import Superseded
from dflash_tasks.core.source_quality import SourceTally
from dflash_tasks.core.stored_counts import stored_tokens
from dflash_tasks.core.trainable import (
    TrainableSummary,
    counter_for,
    earlier_turns_trained,
    served_model_path,
)
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.core.yields import YieldTally

_BATCH = 256


@dataclass(frozen=True, slots=True)
class ExportOptions:
    drop_checks: frozenset[str] = frozenset()  # checks left out on top of the default ones
    keep_failed: bool = False
    keep: frozenset[str] = frozenset()  # reasons whose rows are written anyway
    layout: str = "auto"  # conversation | per-turn | auto (per-turn where earlier turns go untrained)
    mode: str = "trainer"  # trainer (horizon rule) | validator (SpecForge's validator accepts the file)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--layout {self.layout!r}: one of {', '.join(LAYOUTS)}")
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.mode == "validator" and self.layout == "per-turn":
            raise ConfigError(
                "--layout per-turn --mode validator: SpecForge's validator refuses expanded rows (their "
                "earlier answers carry no reasoning); validate the conversation layout, then expand"
            )


@dataclass(slots=True)
class ExportCounts:
    exported: int = 0
    failed_kept: int = 0
    assistant_turns: int = 0
    multi_turn: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)  # rows written despite a reason, by --keep
    left_out: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _LeftOut:
    """A record left out whole, settled in input order with the candidates around it."""

    row_id: str
    reason: str
    detail: str
    generated: int


_Planned = Candidate | _LeftOut | dict[str, Any]


class RowPlanner:
    """Plans the export of one job's records (one per command)."""

    def __init__(self, job: JobDefinition, view: TrainerView, options: ExportOptions) -> None:
        self.thinking = job.spec.thinking
        self.preserve = job.spec.keeps_history_reasoning
        self.view, self.options = view, options
        self.counts = ExportCounts()
        self.yields = YieldTally()
        self.summary = TrainableSummary(job.quality.min_loss_tokens, view.max_length)
        self.sources = SourceTally()  # a job of several input sources: figures per source
        self._min_loss_tokens = job.quality.min_loss_tokens
        self.on_loop = job.quality.on_loop
        self.layout = options.layout
        self.note = ""  # which tokenizer counts, or why none does
        self._counter: LossTokenCounter | None = None
        self._stored_key: str | None = None  # the view under which a worker's stored count applies
        self._resolved = False
        self._seen: set[str] = set()
        #: When a dict (the preflight's small sample): each written row's trainable tokens in the
        #: yield (yields.written_share), by sample id and turn index (None: a conversation row).
        self.written_loss: dict[tuple[str, int | None], int] | None = None

    @property
    def per_turn(self) -> bool:
        return self.layout == "per-turn"

    @property
    def counted(self) -> bool:
        """Whether loss tokens were counted (here, or by the workers and stored with the records)."""
        return self._resolved and self.yields.counted

    def _resolve(self, record: Record) -> None:
        """Pick the tokenizer (at the first record) and, under ``auto``, the layout."""
        self._resolved = True
        served = served_model_path([record])
        tokenizer = self.view.tokenizer or served
        if tokenizer is not None:
            self._stored_key = view_key(self.view, tokenizer, self.thinking, self.preserve)
        stored = stored_tokens(record, self._stored_key, False) is not None
        whole, self.note = counter_for(self.view, self.thinking, served, self.preserve)
        trained = not self.thinking or self.preserve  # Qwen3's rule: earlier turns lose their reasoning
        if self.layout == "auto" and self.options.mode != "validator" and whole is not None:
            trained = earlier_turns_trained(whole)
        self._pick_layout(trained)
        if whole is not None and self.per_turn and not self.view.last_turn_only:
            self._counter, _ = counter_for(
                replace(self.view, last_turn_only=True), self.thinking, served, self.preserve
            )
            self.note += " (per-turn rows: the last assistant turn of each)"
        else:
            self._counter = whole
        self.yields.counted = self._counter is not None or stored
        if stored and whole is None:
            self.note = f"loss tokens counted by the workers with the tokenizer at {tokenizer} (stored)"

    def _pick_layout(self, earlier_trained: bool) -> None:
        """Under ``auto``: per-turn rows where the trainer would not learn from earlier turns."""
        if self.layout == "auto" and self.options.mode == "validator":
            self.layout = "conversation"  # the validator reads whole conversations (expand after it)
        elif self.layout == "auto":
            self.layout = "conversation" if earlier_trained else "per-turn"

    def use_stored(self, key: str, earlier_trained: bool) -> None:
        """Plan from the counts stored under ``key`` alone, no tokenizer loaded (the worker's live
        yield; ``earlier_trained``: :func:`earlier_turns_trained` of the counter that stored them)."""
        self._resolved = True
        self._stored_key = key
        self._pick_layout(earlier_trained)
        self.note = "loss tokens counted by the workers (stored)"

    def rows(self, records: Iterable[Record]) -> Iterator[dict[str, Any]]:
        """The rows to write, in input order; counts and yields fill in as they go."""
        batch: list[_Planned] = []
        pending = 0
        for record in records:
            if not self._resolved:
                self._resolve(record)
            if record.id in self._seen:  # impossible with a sound store; never export a sample twice
                batch.append(_LeftOut(record.id, "duplicate", "", 0))
                continue
            self._seen.add(record.id)
            self.sources.add(record)
            new = self._candidates(record)
            for c in new:
                if isinstance(c, Candidate):
                    c.source = record.source
            batch += new
            pending += sum(isinstance(c, Candidate) for c in new)
            if pending >= _BATCH:
                yield from self._settle(batch)
                batch, pending = [], 0
        yield from self._settle(batch)

    def _candidates(self, record: Record) -> list[_Planned]:
        self.yields.generated += record.generated_tokens
        self.yields.failed_turns += sum(t.usage.completion_tokens for t in record.turns if not t.ok)
        o = self.options
        failed: list[_Planned] = []
        if not record.ok and self.per_turn and not o.keep_failed:  # its ok turns still train
            failed.append(_LeftOut(record.id, "failed", record.error or "", 0))
        elif not record.ok:
            ok_tokens = sum(t.usage.completion_tokens for t in record.turns if t.ok)
            if not o.keep_failed:
                return [_LeftOut(record.id, "failed", record.error or "", ok_tokens)]
            self.counts.failed_kept += 1
            self.yields.dropped["failed"] += ok_tokens
            turns = row_messages(record)
            return [{"id": record.id, "status": "failed", "conversations": turns, "error": record.error}]
        if self.per_turn:
            # auto: a sample of one generated turn keeps its own id (the row is the same either way)
            plain = o.layout == "auto" and sum(t.ok for t in record.turns) == 1
            rows = per_turn_candidates(record, self.thinking, o.drop_checks, plain, self.on_loop)
        else:
            keep_sources = "source_answers" in o.keep
            rows = [conversation_candidate(record, self.thinking, o.drop_checks, keep_sources, self.on_loop)]
        self._attach_stored(record, rows)
        return [*failed, *rows]

    def _attach_stored(self, record: Record, rows: list[Candidate]) -> None:
        """Give each row the count the worker stored with the record, under this view."""
        stored = stored_tokens(record, self._stored_key, self.per_turn)
        if stored is None or len(stored) != len(rows):
            return
        for c, tokens in zip(rows, stored, strict=True):
            c.tokens = tokens

    def _settle(self, batch: list[_Planned]) -> Iterator[dict[str, Any]]:
        uncounted = [c for c in batch if isinstance(c, Candidate) and c.tokens is None]
        count(self._counter, uncounted)
        if self._counter is None and uncounted:
            self.yields.counted = False  # a record without a stored count, and no tokenizer here
        for c in batch:
            if isinstance(c, dict):  # a failed record kept by --keep-failed
                yield c
                continue
            if isinstance(c, _LeftOut):
                self._leave_out(c.row_id, c.reason, c.detail, c.generated)
                continue
            row = self._decide(c)
            if row is not None:
                yield row

    def _decide(self, c: Candidate) -> dict[str, Any] | None:
        """The row when the trainer gets it (counted), else None (left out, counted)."""
        horizon = False
        kept: list[str] = []
        keep = self.options.keep
        if self.options.mode == "trainer" and c.cut_short:
            horizon, why = within_horizon(c, self.thinking, self.view.max_length, self.per_turn, keep)
            deciding = next((i for i, (reason, _) in enumerate(c.reasons) if reason not in keep), None)
            if not horizon and why and deciding is not None and c.reasons[deciding][0] == "truncated":
                c.reasons[deciding] = ("truncated", why)
        for reason, detail in c.reasons:
            if horizon and reason in ("truncated", "empty_answer", "empty_message"):
                continue
            if reason not in keep:
                self._leave_out(c.row["id"], reason, detail, c.generated, c.looping)
                return None
            kept.append(reason)
        self.counts.kept.update(kept)
        self.counts.exported += 1
        self.sources.add_row(c.source, c.tokens.loss_tokens if c.tokens else None, self._min_loss_tokens)
        assistants = sum(1 for m in c.row["conversations"] if m["role"] == "assistant")
        self.counts.assistant_turns += 1 if self.per_turn else assistants
        self.counts.multi_turn += assistants > 1
        self.yields.horizon_rows += horizon
        self.yields.looping += c.looping
        if c.tokens is None:
            self.yields.add_written(c.generated)
        else:
            self.summary.add(c.tokens)
            trainable = self.yields.add_written(
                c.generated, c.tokens.loss_tokens, c.tokens.lost_to_max_length
            )
            if self.written_loss is not None:
                self.written_loss[(c.sample_id, c.turn)] = trainable
        if self.options.keep_failed:
            c.row["error"] = None
        return c.row

    def add_superseded(self, superseded: Superseded) -> None:
        """The attempts repair rounds replaced (the reader's ``on_replaced``), once read: to the
        yield's generated total and to each source's figures alike."""
        self.yields.add_superseded(superseded.tokens, superseded.looping)
        self.sources.add_superseded(superseded)

    def per_source(self) -> dict[str, Any] | None:
        """Per input source (a job of several): its records' figures, the rows planned, their loss
        tokens (None when no tokenizer counted); None for a job of one source."""
        doc = self.sources.to_dict()
        for name, figures in doc.items():
            figures["rows_exported"] = self.sources.sources[name].rows_exported
            if not self.counted:
                figures["loss_tokens"] = None
            figures.pop("few_loss_tokens", None)
        return doc or None

    def _leave_out(self, row_id: str, reason: str, detail: str, generated: int, looping: int = 0) -> None:
        """Count a row left out: its tokens to ``reason``, those of a loop (and of a row left out
        for its loop) to ``looping``."""
        self.counts.dropped[reason] += 1
        self.counts.left_out.append({"id": row_id, "reason": reason, "detail": detail})
        if reason == "looping":
            self.yields.looping += generated + looping
        else:
            self.yields.dropped[reason] += generated
            self.yields.looping += looping
